source .device/common.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/gpu.txt
python3 -c "import torch,triton,timm;print(torch.__version__,triton.__version__,timm.__version__,torch.backends.cudnn.version())" >> $OUT/gpu.txt
phase train224 240 python3 -m benchmarks.train --models vit_base_patch16_224 --batch-size 256 --eager timm flash --compiled timm flash --rounds 4 --out $OUT --name train224_b256
phase prof_flash 110 python3 -m benchmarks.profile_step --top 16
phase prof_timm 110 python3 -m benchmarks.profile_step --timm --top 16
finish
