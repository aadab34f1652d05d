source .device/common.sh
BUDGET=380
phase warm 90 python3 -u benchmarks/flash_bench.py --warm --no-table
phase sweep64 170 python3 -u benchmarks/flash_bench.py --sweep --kernels fwd,fwd_tma,dkdv,dkdv_tma,dq,dq_tma --shapes "8,12,4096,64;32,12,1024,64"
phase train1024c 150 python3 -m benchmarks.train --models vit_base_patch16_1024 --compiled timm flash --eager --rounds 4 --out $OUT --name train1024_compiled
finish
grep "^sweep" $OUT/sweep64.log | cut -c1-400; grep "^| vit" $OUT/train1024_compiled.md | cut -d'|' -f3-8
