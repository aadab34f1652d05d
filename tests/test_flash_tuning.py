"""The flash autotuner's config rows and its measure (kernels/flash/configs.py)."""
import os
import threading
import time

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
        assert any(len(row) == 4 for row in rows), f"{which} {cls}: fp32_delta's variants need a row without a cap"
        for row in rows:
            assert len(row) in (4, 5), row
            assert all(b & (b - 1) == 0 and b >= 16 for b in row[:2]), f"{which} {cls} {row}: tiles are powers of two"
            assert row[2] in (4, 8) and 1 <= row[3] <= 4, row
            if len(row) == 5:  # ptxas allocates registers in steps of 8, at most 255 a thread
                assert 64 <= row[4] <= 248 and row[4] % 8 == 0, row


def test_every_kernel_is_tuned_by_the_back_to_back_measure():
    for name in ("FWD", "DKDV", "DQ"):
        for cls, tuner in getattr(configs, name).items():
            assert tuner._do_bench is configs._bench, f"{name} {cls}"


def test_the_sweep_reads_a_fifth_number_as_a_cap_or_as_warp_specialisation():
    from benchmarks import flash_bench

    capped = flash_bench._single("dkdv", (32, 64, 4, 3, 128)).configs[0]
    assert capped.maxnreg == 128 and capped.kwargs == {"BLOCK_M1": 32, "BLOCK_N1": 64}
    assert flash_bench._single("dq", (64, 32, 4, 3)).configs[0].maxnreg is None
    tma = flash_bench._single("dkdv_tma", (32, 64, 4, 3, True)).configs[0]
    assert tma.maxnreg is None and tma.kwargs["WARP_SPECIALIZE"] is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA launches")
def test_the_measure_ranks_twice_the_work_about_twice_as_slow():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    once = configs._bench(lambda: torch.mm(a, a), (0.5, 0.2, 0.8))
    twice = configs._bench(lambda: (torch.mm(a, a), torch.mm(a, a)), (0.5, 0.2, 0.8))
    assert once[0] > 0
    assert 1.6 < twice[0] / once[0] < 2.5, (once, twice)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA launches")
def test_the_measure_leaves_out_the_hosts_launch_cost():
    """A launch that costs the host 50 µs but the GPU a few µs measures as GPU time: timed launch by launch, as
    do_bench does, or without the sleep in front, it would read at least 0.05 ms."""
    x = torch.randn(1024, device="cuda")

    def slow_host_launch():
        time.sleep(50e-6)
        x.add_(1.0)

    assert configs._bench(slow_host_launch, (0.5,))[0] < 0.03


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA launches")
def test_the_measure_times_one_launch_longer_than_a_round_and_runs_on_the_callers_stream():
    def long_launch():
        torch.cuda._sleep(40_000_000)  # about 20 ms at 2 GHz

    with torch.cuda.stream(torch.cuda.Stream()):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        long_launch()
        end.record()
        end.synchronize()
        ms = configs._bench(long_launch, (0.5,))[0]
    assert ms > configs._ROUND_MS and 0.8 < ms / start.elapsed_time(end) < 1.25, (ms, start.elapsed_time(end))


class _FakeGPU:
    """Two clocks for _bench's control flow on a CPU, in ms: the host's, which each launch advances by host_ms, and
    the GPU's, which runs a launch or sleep from when it is both queued and the GPU is free. Events read the GPU's
    clock where they are queued; synchronize moves the host's clock up to it."""

    def __init__(self, kernel_ms, host_ms, cycles_per_ms=2e6):
        self.host, self.gpu, self.kernel_ms, self.host_ms = 0.0, 0.0, kernel_ms, host_ms
        self.cycles_per_ms, self.launches = cycles_per_ms, 0
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = max(gpu.gpu, gpu.host)

            def synchronize(self):
                gpu.host = max(gpu.host, self.at)

            def elapsed_time(self, other):
                return other.at - self.at

        self.Event = Event

    def _run(self, ms):
        self.gpu = max(self.gpu, self.host) + ms

    def perf_counter(self):
        return self.host / 1e3

    def sleep(self, cycles):
        self._run(cycles / self.cycles_per_ms)

    def launch(self):
        self.host += self.host_ms
        self.launches += 1
        self._run(self.kernel_ms)


@pytest.mark.parametrize("kernel_ms, host_ms", [(0.004, 0.05), (0.004, 0.001), (0.3, 0.02), (0.3, 0.5), (30.0, 0.02)])
def test_the_measure_reports_the_gpu_time_per_launch_whatever_the_host_costs(kernel_ms, host_ms, monkeypatch):
    """Exactly the kernel's time, also where the host takes 12× longer to queue a launch than the GPU to run it: the
    sleep in front of each round keeps the GPU from catching up with the host."""
    gpu = _FakeGPU(kernel_ms, host_ms)
    monkeypatch.setattr(configs.torch.cuda, "Event", gpu.Event)
    monkeypatch.setattr(configs.torch.cuda, "_sleep", gpu.sleep)
    monkeypatch.setattr(configs.time, "perf_counter", gpu.perf_counter)
    assert configs._bench(gpu.launch, (0.5, 0.2, 0.8)) == pytest.approx([kernel_ms] * 3)
    assert gpu.launches <= 2 + (configs._ROUNDS + 1) * configs._CALLS


def test_the_measure_would_see_the_host_without_its_sleeps(monkeypatch):
    """The fake timeline can fail the test above: without the sleeps a slow host's launches read as its own time."""
    gpu = _FakeGPU(0.004, 0.05)
    monkeypatch.setattr(configs.torch.cuda, "Event", gpu.Event)
    monkeypatch.setattr(configs.torch.cuda, "_sleep", lambda cycles: gpu.sleep(cycles if cycles == 1_000_000 else 0))
    monkeypatch.setattr(configs.time, "perf_counter", gpu.perf_counter)
    assert configs._bench(gpu.launch, (0.5,))[0] == pytest.approx(0.05, rel=0.01)  # not the kernel's 0.004


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA launches beside a CUDA thread")
def test_the_measure_leaves_other_threads_free_to_use_cuda():
    """A loader thread allocating, drawing CUDA random numbers and syncing meanwhile is not disturbed (a CUDA graph
    capture, even thread-local, fails its random draws)."""
    stop, errors, draws = threading.Event(), [], []

    def loader():
        stream = torch.cuda.Stream()
        try:
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    draws.append(torch.empty(1 << 20, device="cuda").uniform_().sum().item())
        except Exception as error:  # noqa: BLE001  reported below
            errors.append(error)

    thread = threading.Thread(target=loader)
    thread.start()
    a = torch.randn(1024, 1024, device="cuda")
    try:
        before = len(draws)
        for _ in range(5):
            assert configs._bench(lambda: torch.mm(a, a), (0.5,))[0] > 0
        during = len(draws) - before
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert during > 0, "the loader thread made no draws while the measure ran"
