"""The flash autotuner's config rows and its measure (kernels/flash/configs.py)."""
import os
import threading

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from kernels.flash import configs

TABLES = {"fwd": configs._FWD, "dkdv": configs._DKDV, "dq": configs._DQ}


def test_a_row_with_a_register_cap_becomes_a_config_with_maxnreg():
    capped, plain = configs._cfgs(("BLOCK_M", "BLOCK_N"), [(64, 64, 4, 3, 112), (128, 32, 8, 2)])
    assert capped.kwargs == {"BLOCK_M": 64, "BLOCK_N": 64} and capped.maxnreg == 112
    assert (capped.num_warps, capped.num_stages) == (4, 3)
    assert plain.maxnreg is None and (plain.num_warps, plain.num_stages) == (8, 2)


@pytest.mark.parametrize("which", sorted(TABLES))
def test_every_row_is_a_valid_launch_shape(which):
    for cls, rows in TABLES[which].items():
        assert len(rows) == 3, f"{which} {cls}: test_flash_tails pins rows 0-2"
        for row in rows:
            assert len(row) in (4, 5), row
            assert all(b & (b - 1) == 0 and b >= 16 for b in row[:2]), f"{which} {cls} {row}: tiles are powers of two"
            assert row[2] in (4, 8) and 1 <= row[3] <= 4, row
            if len(row) == 5:  # a cap must leave room: 65536 registers an SM over num_warps · 32 threads
                assert 64 <= row[4] <= 255 and row[4] * row[2] * 32 <= 65536, row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA launches")
def test_the_measure_ranks_twice_the_work_about_twice_as_slow():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    once = configs._bench(lambda: torch.mm(a, a), (0.5, 0.2, 0.8))
    twice = configs._bench(lambda: (torch.mm(a, a), torch.mm(a, a)), (0.5, 0.2, 0.8))
    assert once[1] <= once[0] <= once[2] and once[0] > 0
    assert 1.6 < twice[0] / once[0] < 2.5, (once, twice)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA launches beside a CUDA thread")
def test_the_measure_leaves_other_threads_free_to_use_cuda():
    """A loader thread allocating, drawing CUDA random numbers and syncing meanwhile is not disturbed (a CUDA graph
    capture, even thread-local, fails its random draws)."""
    stop, errors = threading.Event(), []

    def loader():
        stream = torch.cuda.Stream()
        try:
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    torch.empty(1 << 20, device="cuda").uniform_().sum().item()
        except Exception as error:  # noqa: BLE001  reported below
            errors.append(error)

    thread = threading.Thread(target=loader)
    thread.start()
    a = torch.randn(1024, 1024, device="cuda")
    try:
        for _ in range(5):
            assert configs._bench(lambda: torch.mm(a, a), (0.5,))[0] > 0
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
