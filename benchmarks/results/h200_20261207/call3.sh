# Call 3: ViT-B/16 training at 1024 px, torch.compile, with the sequential and the ping-pong backward consumers (each beside timm + SDPA).
source .device/common.sh
BUDGET=340
export MAX_JOBS=16
phase build 60 python3 -u -c "from kernels.cuda import build; build.extension()"
phase trainseq 165 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager --compiled timm cuda --rounds 2 --steps 20 --max-minutes 2.6 --out $OUT --name train_seq_compiled
VIT_CUDA_BWD_SM90=pingpong phase trainpp 165 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager --compiled timm cuda --rounds 2 --steps 20 --max-minutes 2.6 --out $OUT --name train_pp_compiled
finish
for f in train_seq_compiled train_pp_compiled; do echo "== $f"; grep "^| vit" $OUT/$f.md | cut -d'|' -f2-8,17; done
