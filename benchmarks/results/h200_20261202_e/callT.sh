# the short backward probe, then the Gluon GPU tests with N unspecialised
source .device/common.sh
phase short 300 python3 benchmarks/results/h200_20261202_e/short_probe.py
phase gluon_tests 230 python3 -m pytest -q -m gpu tests/test_flash_gluon.py --maxfail=10 -rxXfs
cd $OUT && tar czf all.tgz *.log *.txt 2>/dev/null; cat phases.txt
