source .device/common.sh
BUDGET=420
export MAX_JOBS=16
phase build 110 python3 -u -c "from kernels.cuda import build; build.extension()"
phase segv 100 bash .device/segv_probe.sh
phase sweep 120 python3 -u .device/fwd_sweep.py
phase ncu 150 ncu --profile-from-start off -k regex:bwd_sm90 -c 2 --set full --import-source no -o $OUT/bwd python3 .device/ncu_bwd.py
ncu -i $OUT/bwd.ncu-rep --page source --csv --print-source sass > $OUT/bwd_source.csv 2> $OUT/bwd_source.err
ncu -i $OUT/bwd.ncu-rep --page details --print-details all > $OUT/bwd_details.txt 2>&1
ls -la $OUT > $OUT/ls.txt
cd $OUT && tar czf all.tgz *.log *.txt *.csv *.err bwd.ncu-rep; cat phases.txt
cat $OUT/segv.log; cat $OUT/sweep.log; head -c 600 $OUT/bwd_source.csv; tail -5 $OUT/bwd_source.err
