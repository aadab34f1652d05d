# Call 6 (the same machine, one command line): ViT-B/16 at 224 px, batch 256, compiled, timm + SDPA and cuda.
source .device/common.sh; BUDGET=170; phase train224c 165 python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 256 --eager --compiled timm cuda --rounds 2 --steps 20 --max-minutes 2.7 --out $OUT --name train224c; finish; grep "^| vit" $OUT/train224c.md | cut -d"|" -f2-8
