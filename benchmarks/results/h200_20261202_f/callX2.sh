source .device/common.sh
phase train_X2 520 python3 -m benchmarks.train --preset range --models vit_base_patch16_224 vit_base_patch16_512 --eager timm flash --compiled timm flash --rounds 4 --max-minutes 8.5 --out $OUT --name train_range_X2
cd $OUT && tar czf all.tgz *.log *.txt *.md *.json 2>/dev/null; cat phases.txt
