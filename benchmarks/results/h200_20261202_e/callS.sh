# next session's first call: the Gluon kernels' GPU tests and timing, then the regime probe
source .device/common.sh
phase gluon_tests 220 python3 -m pytest -q -m gpu tests/test_flash_gluon.py --maxfail=5 -rxXfs
phase gluon_bench 200 python3 benchmarks/flash_bench.py --gluon
phase regime 100 python3 benchmarks/results/h200_20261202_d/regime_probe.py
cd $OUT && tar czf all.tgz *.log *.txt 2>/dev/null; cat phases.txt
