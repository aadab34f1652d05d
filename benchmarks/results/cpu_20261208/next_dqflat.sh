# Not run yet: one call (about 8 minutes, any Hopper GPU) for branch wip/dqflat (dqflat.patch beside this file: the
# sm90 backward's TMA-added dQ staged in the accumulator fragments' order and added by one bulk reduce-add a step,
# into a tiled dq_accum that a new dq kernel puts back in row order). h100_20261207f/next_bwd_tail.sh does the work:
# it builds main and the patched copy, runs the CUDA GPU suite on the copy, times cuda-auto (and here the persistent
# backward) on both twice, alternating, and writes /tmp/wip_ok when the copy passes its tests and its fwd+bwd is no
# slower overall (geometric mean) and at most 3 % slower at any shape (watch N = 197: the padded last tile); then
# next_h200.sh on the same warm machine measures the copy.
# Setup on the main checkout: this file, dqflat.patch, benchmarks/results/h100_20261207f/next_bwd_tail.sh and
# benchmarks/results/h100_20261205/common.sh in .device/, `git rev-parse --short HEAD > .device/COMMIT`, carry
# [".whl", ".device"]; `bash .device/next_dqflat.sh`.
PATCH=dqflat.patch ROWS="cuda-auto cuda-sm90-persistent" BUDGET_S=${BUDGET_S:-560} source .device/next_bwd_tail.sh
