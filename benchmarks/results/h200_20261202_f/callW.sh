source .device/common.sh
phase ws_tests 120 python3 -m pytest -q -m gpu tests/test_flash_gluon_ws.py -k tiles -x -rxXfs
phase ws_bench 300 python3 benchmarks/flash_bench.py --gluon-ws
cd $OUT && tar czf all.tgz *.log *.txt 2>/dev/null; cat phases.txt
