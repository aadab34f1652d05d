"""vit.distributed.init_distributed on one process: an explicit cuda:N becomes the current device."""
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
