source .device/common.sh
phase build 120 python3 -m kernels.flash.native
phase gpu_tests 150 python3 -m pytest -q -x tests/test_flash_native.py tests/test_flash.py -k "compiled or native_forward_op or cpp" -rxXfs
phase train_1024 200 python3 -m benchmarks.train --preset range --models vit_base_patch16_1024 --eager --compiled timm flash --rounds 2 --max-minutes 5 --out $OUT --name train_1024_native_fwd
phase train_224 150 python3 -m benchmarks.train --preset range --models vit_base_patch16_224 --eager --compiled timm flash --rounds 2 --max-minutes 4 --out $OUT --name train_224_native_fwd
cd $OUT && tar czf all.tgz *.log *.txt *.md *.json 2>/dev/null; cat phases.txt
