"""A single process on cuda:N: vit.distributed.init_distributed makes it the current device, vit.build.resolve_device
rejects an index past the visible GPUs."""
import pytest
import torch

from vit.distributed import init_distributed


def test_single_process_on_cuda_n_sets_the_current_device(monkeypatch):
    """train.py device=cuda:1 on one process: Triton launches on the current device, so it must be GPU 1."""
    calls = []
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert init_distributed(torch.device("cuda", 1)).world_size == 1
    assert calls == [torch.device("cuda", 1)]
    init_distributed(torch.device("cuda"))  # no index: the current device stays
    init_distributed(torch.device("cpu"))
    assert calls == [torch.device("cuda", 1)]


def test_cuda_index_past_the_visible_gpus_raises_clearly(monkeypatch):
    """device=cuda:1 on a one-GPU machine: a clear error before set_device's 'invalid device ordinal'."""
    from vit.build import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0) and resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(RuntimeError, match=r"device=cuda:1 .* 1 visible GPU\(s\), cuda:0 to cuda:0"):
        resolve_device("cuda:1")
