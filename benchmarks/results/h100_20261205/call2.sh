source .device/common.sh
BUDGET=540
{ date -u +%FT%T; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, timm, torchvision; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version())"; } > $OUT/env.txt 2>&1
git diff HEAD --stat > $OUT/diff_stat.txt 2>&1
export MAX_JOBS=16
phase flash_native_build 200 python3 -u -c "from kernels.flash import native; native.load()"
phase flashtests 480 python3 -u -m pytest -v -m gpu -p no:cacheprovider -rfE --durations=0 $(cat .device/flash_rest2.txt)
finish
tail -30 $OUT/flashtests.log
