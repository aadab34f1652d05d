source .device/common.sh
phase train_Y 520 python3 -m benchmarks.train --preset range --models vit_base_patch16_1024 --eager timm flash --compiled timm flash --rounds 4 --max-minutes 8.5 --out $OUT --name train_range_Y
phase flash_table 200 python3 benchmarks/flash_bench.py
cd $OUT && tar czf all.tgz *.log *.txt *.md *.json 2>/dev/null; cat phases.txt
