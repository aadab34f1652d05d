source .device/common.sh
phase train1024 240 python3 -m benchmarks.train --models vit_base_patch16_1024 --eager timm flash --compiled timm flash --rounds 4 --out $OUT --name train1024_b8
phase gpu_model 120 python3 -m pytest -q -m gpu tests/test_model.py
finish
