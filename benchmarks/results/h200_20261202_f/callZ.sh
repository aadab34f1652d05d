source .device/common.sh
M=vit_base_patch16_1024
phase prof_ours_compiled 150 python3 -m benchmarks.profile_step --model $M --warmup 3 --steps 3 --top 14
phase prof_timm_compiled 150 python3 -m benchmarks.profile_step --model $M --timm --warmup 3 --steps 3 --top 14
phase prof_ours_eager 60 python3 -m benchmarks.profile_step --model $M --eager --warmup 3 --steps 3 --top 14
phase prof_timm_eager 60 python3 -m benchmarks.profile_step --model $M --timm --eager --warmup 3 --steps 3 --top 14
cd $OUT && tar czf all.tgz *.log *.txt 2>/dev/null; cat phases.txt
