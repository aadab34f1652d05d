source .device/common.sh
phase ws_smoke 90 python3 .device/smoke_ws.py
phase ws_tests 150 python3 -m pytest -q -m gpu tests/test_flash_gluon_ws.py -x -rxXfs
phase ws_bench 240 python3 benchmarks/flash_bench.py --gluon --forward-only
cd $OUT && tar czf all.tgz *.log *.txt 2>/dev/null; cat phases.txt
