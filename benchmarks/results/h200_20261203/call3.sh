source .device/common.sh
phase train_small 330 python3 -m benchmarks.train --preset range --models vit_base_patch16_224_b16 vit_base_patch16_224_b64 --eager timm flash --compiled timm flash --rounds 4 --max-minutes 5.5 --out $OUT --name train_range_small
phase train_512 200 python3 -m benchmarks.train --preset range --models vit_base_patch16_512 --eager timm flash --compiled timm flash --rounds 4 --max-minutes 3.3 --out $OUT --name train_range_512
finish
