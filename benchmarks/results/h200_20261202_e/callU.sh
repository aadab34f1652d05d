# the rest of the Gluon GPU tests (call T ran the first 89, all passed), then ncu of the Gluon and Triton forwards
source .device/common.sh
phase gluon_rest 200 python3 -m pytest -q -p no:cacheprovider -rxXfs $(cat benchmarks/results/h200_20261202_e/gluon_rest.txt)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
SECT="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
MET="--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active"
phase ncu_gluon 120 $NCU --profile-from-start off $SECT python3 benchmarks/results/h200_20261202_e/ncu_gluon.py 8 12 4096 64
phase ncum_gluon 80 $NCU --profile-from-start off $MET python3 benchmarks/results/h200_20261202_e/ncu_gluon.py 8 12 4096 64
cd $OUT && tar czf all.tgz *.log *.txt 2>/dev/null; cat phases.txt
