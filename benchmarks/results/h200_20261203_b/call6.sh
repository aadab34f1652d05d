BUDGET=580; source .device/common.sh
S="8,12,4097,64 32,12,1024,64 256,12,197,64 8,16,4096,128"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $OUT/gpu.txt 2>&1
phase sweep_pipe1 170 python3 benchmarks/flash_bench.py --sweep --kernels dkdv,fwd --shapes $S --no-table
cp .device/kernels_orig.py kernels/flash/kernels.py
phase sweep_orig 150 python3 benchmarks/flash_bench.py --sweep --kernels dkdv,fwd --shapes $S --no-table
cp .device/kernels_fwdpipe.py kernels/flash/kernels.py
phase sweep_pipe2 90 python3 benchmarks/flash_bench.py --sweep --kernels dkdv,fwd --shapes $S --no-table
phase gaps1024_flash 150 python3 -m benchmarks.profile_step --model vit_base_patch16_1024 --top 6 --gaps 12
finish
