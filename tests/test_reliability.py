"""Bad input, numerical faults and security: every failure is early, named and leaves the run's files intact.

- invalid config values (including a head_dim the chosen kernel cannot run) fail in
  ``check_train_config``, before any output folder exists, naming key, value and what is allowed;
- weights with missing/unexpected keys or of another model size name them;
- a NaN loss in a real run stops it naming the step, and the checkpoints on disk are byte-identical
  to what they were before the NaN; ``nonfinite.policy=skip`` skips the step and finishes;
- a checkpoint whose pickle would run code is refused by every loader (resume, resume=auto,
  init_from, eval.py) and the code never runs;
- secrets in the environment never reach the logged W&B config.
(Crash/resume under SIGKILL: tests/test_crash_resume.py; bad image files: tests/test_images.py.)
"""
from __future__ import annotations

import hashlib
import os
import pickle
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from eval import evaluate_checkpoint
from train import train
from vit.build import check_train_config, resolve_backend
from vit.checkpoint import find_latest_checkpoint, load_checkpoint, load_model_weights
from vit.engine import NonFiniteLossError
from vit.model import SIZES, create_model

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")
SYNTHETIC = ["data=synthetic", "data.img_size=16", "data.num_classes=4", "data.train_samples=128",
             "data.val_samples=32", "batch_size=16", "eval_batch_size=32", "epochs=1", "attention=naive",
             "device=cpu", "progress=false", "log_every=1"]  # 8 optimizer steps


def compose_cfg(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


# ---- bad config values -------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("batch_size=-8", "batch_size=-8: a positive integer"),
    ("model.size=huge", "model.size='huge': one of debug, tiny, small, base, large"),
    ("data.img_size=34", "data.img_size=34: a multiple of model.patch_size=4"),
    ("eval_batch_size=0", "eval_batch_size=0: a positive integer"),
    ("checkpoint.keep_last=-1", "checkpoint.keep_last=-1: an integer >= 0"),
    ("checkpoint.every_steps=-5", "checkpoint.every_steps=-5: an integer >= 0"),
    ("nonfinite.max_skips=-1", "nonfinite.max_skips=-1: an integer >= 0"),
    ("schedule.warmup_epochs=-1", "schedule.warmup_epochs=-1: a number >= 0"),
    ("data.num_workers=-2", "data.num_workers=-2: auto (min(8, cores - 1)) or an integer >= 0"),
    ("amp=fp16", "amp='fp16': one of auto, bf16, none for training"),
])
def test_invalid_value_fails_before_any_work(override, message, tmp_path):
    cfg = compose_cfg("train", [override, f"out_dir={tmp_path / 'out'}", "logger=none"])
    with pytest.raises(ValueError, match="invalid config value " + message.replace("(", r"\(").replace(")", r"\)")):
        train(cfg)
    assert not (tmp_path / "out").exists()  # nothing was written: the check ran first


def test_head_dim_limits_table_matches_the_backends():
    """kernels.HEAD_DIM_LIMITS (read by the config check without importing Triton or building CUDA)
    agrees with what the backends themselves accept and refuse."""
    import kernels.cuda
    import kernels.flash

    assert kernels.HEAD_DIM_LIMITS["flash"] == (kernels.flash.MIN_HEAD_DIM, kernels.flash.MAX_HEAD_DIM)
    assert kernels.HEAD_DIM_LIMITS["cuda"] == (1, kernels.cuda.HEAD_DIMS[-1])
    lo, hi = kernels.HEAD_DIM_LIMITS["flash"]
    for d in (lo - 1, hi + 1):
        q = torch.randn(1, 1, 4, d)
        with pytest.raises(ValueError, match=f"head_dim={d} is outside"):
            kernels.flash.attention(q, q, q)
    q = torch.randn(1, 1, 4, kernels.HEAD_DIM_LIMITS["cuda"][1] + 1, dtype=torch.float16)
    with pytest.raises(ValueError, match="supports head_dim ≤ 128"):
        kernels.cuda.check_inputs(q, q, q)


@pytest.mark.parametrize("attention, embed_dim, num_heads, head_dim, allowed", [
    ("flash", 64, 8, 8, "16-256"),
    ("cuda", 512, 2, 256, "1-128"),
])
def test_head_dim_the_kernel_cannot_run_fails_in_the_config_check(monkeypatch, attention, embed_dim, num_heads,
                                                                  head_dim, allowed):
    monkeypatch.setitem(SIZES, "odd", {"embed_dim": embed_dim, "depth": 1, "num_heads": num_heads})
    cfg = compose_cfg("train", [f"attention={attention}", "model.size=odd"])
    with pytest.raises(ValueError, match=rf"attention.name='{attention}': a backend that runs head_dim={head_dim} "
                                         rf"\(model.size=odd: embed_dim {embed_dim} / num_heads {num_heads}\); "
                                         rf"attention={attention} runs head_dim {allowed}"):
        check_train_config(cfg)
    check_train_config(compose_cfg("train", ["attention=naive", "model.size=odd"]))  # naive runs any head_dim


def test_unset_data_root_names_the_key(tmp_path):
    cfg = compose_cfg("train", ["data=imagefolder", "logger=none", f"out_dir={tmp_path / 'out'}", "attention=naive"])
    with pytest.raises(ValueError, match=r"data.root is not set for data=imagefolder; pass data.root="):
        train(cfg)
    assert not (tmp_path / "out").exists()


def test_crash_hook_is_inert_unless_it_names_the_event(monkeypatch):
    """VIT_TEST_CRASH_AT (tests/test_crash_resume.py) does nothing when unset or set to another event;
    a failure here kills the test process."""
    from vit.checkpoint import crash_point

    monkeypatch.delenv("VIT_TEST_CRASH_AT", raising=False)
    for event in ("step", "val", "save", "saved"):
        crash_point(event)
    monkeypatch.setenv("VIT_TEST_CRASH_AT", "val:1")
    for event in ("step", "save", "saved"):
        crash_point(event)



def test_backend_that_cannot_run_on_this_device_fails_before_any_work(tmp_path):
    cfg = compose_cfg("train", [*SYNTHETIC, "attention=cuda", f"out_dir={tmp_path / 'out'}", "logger=none"])
    with pytest.raises(RuntimeError, match=r"attention=cuda runs on a CUDA GPU but this run's device is cpu"):
        train(cfg)
    assert not (tmp_path / "out").exists()


def test_resolve_backend_checks_device_and_dtype(monkeypatch):
    gpu, cpu = torch.device("cuda"), torch.device("cpu")  # a device object needs no GPU
    with pytest.raises(RuntimeError, match=r"attention=cuda computes in bf16/fp16 only.*use amp=bf16"):
        resolve_backend("cuda", gpu, None)
    assert resolve_backend("cuda", gpu, torch.bfloat16) == "cuda"
    import kernels.flash.configs as flash_configs
    assert resolve_backend("flash", cpu, None) == "flash"  # CI: Triton's interpreter (tests/conftest.py)
    monkeypatch.setattr(flash_configs, "INTERPRETED", False)
    with pytest.raises(RuntimeError, match=r"attention=flash runs on a CUDA GPU but this run's device is cpu.*"
                                           r"TRITON_INTERPRET=1"):
        resolve_backend("flash", cpu, None)

# ---- runs that start but would not go as meant ------------------------------------------------

def test_too_many_tokens_warns_at_start_up_and_cpu_out_of_memory_gets_the_clear_message(monkeypatch, tmp_path):
    """model=debug (patch 4) at 224 px: N = 3137. The warning comes before the first forward; a forward that asks
    the CPU allocator for more than the machine has gives the out-of-memory message GPUs get, naming N."""
    from vit.build import ConfigWarning
    from vit.engine import TrainingOutOfMemoryError
    from vit.model import VisionTransformer

    seen_before_forward = []

    def forward(self, x):
        seen_before_forward.extend(str(w.message) for w in caught)
        return torch.empty(1 << 60, dtype=torch.uint8)  # 1 EiB: the CPU allocator's real error

    monkeypatch.setattr(VisionTransformer, "forward", forward)
    cfg = compose_cfg("train", [*SYNTHETIC, "data.img_size=224", "batch_size=4", f"out_dir={tmp_path}",
                                "logger=none"])
    with warnings.catch_warnings(record=True) as caught, pytest.raises(TrainingOutOfMemoryError) as error:
        warnings.simplefilter("always", ConfigWarning)
        train(cfg)
    [token_warning] = [m for m in seen_before_forward if "tokens per image" in m]
    assert ("model=debug (patch_size 4) at data.img_size=224 gives N=3137 tokens per image" in token_warning
            and "use model=tiny, model=small or model=base (patch 16: N=197)" in token_warning)
    message = str(error.value)
    assert message.startswith("out of memory in a training step on cpu: attention=naive, N=3137 tokens, micro-batch 4")
    assert "DefaultCPUAllocator: can't allocate memory" in str(error.value.__cause__)


def test_token_warning_spares_patch_16_with_linear_memory_attention():
    from vit.build import token_count_warning

    vit_b_1024 = {"size": "base", "img_size": 1024, "patch_size": 16}  # N = 4097, the README's high-res run
    assert token_count_warning(vit_b_1024, "flash", 16) is None
    assert "use attention=flash" in token_count_warning(vit_b_1024, "naive", 16)
    assert token_count_warning({"size": "debug", "img_size": 32, "patch_size": 4}, "naive", 32) is None  # digits


@pytest.mark.parametrize("epochs, warns", [(2, True), (3, False)])
def test_epochs_within_warmup_warn_at_start_up(epochs, warns, tmp_path):
    from vit.build import ConfigWarning

    cfg = compose_cfg("train", [*SYNTHETIC, f"epochs={epochs}", "schedule.warmup_epochs=2", "data.train_samples=32",
                                f"out_dir={tmp_path}", "logger=none"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        train(cfg)
    found = [str(w.message) for w in caught if "warm-up" in str(w.message)]
    expected = ("schedule.warmup_epochs=2 is not below epochs=2: the run never leaves warm-up (the learning rate "
                "rises linearly from schedule.warmup_lr_init over the whole run, reaches the peak only at its last "
                "step and never decays); lower schedule.warmup_epochs or raise epochs")
    assert found == ([expected] if warns else [])


# ---- weights that do not fit -------------------------------------------------------------------

def test_weights_with_missing_and_unexpected_keys_name_them():
    model = create_model("debug", img_size=16, patch_size=4, num_classes=3)
    sd = model.state_dict()
    sd.pop("blocks.1.attn.qkv.weight")
    sd["head2.weight"] = torch.randn(3, 64)
    with pytest.raises(RuntimeError, match=r"missing keys \(1\): blocks.1.attn.qkv.weight"
                                           r"(.|\n)*unexpected keys \(1\): head2.weight"):
        load_model_weights(model, sd, source="w.pt")


def test_weights_of_another_model_size_name_the_shapes():
    model = create_model("debug", img_size=16, patch_size=4, num_classes=3)
    other = create_model("tiny", img_size=16, patch_size=4, num_classes=3).state_dict()
    with pytest.raises(RuntimeError, match=r"shape mismatches \(another model size.*blocks.0.attn.proj.bias: \(192,\) "
                                           r"in w.pt, \(64,\) in model(.|\n)*unexpected keys \(\d+\): blocks.10."):
        load_model_weights(model, other, source="w.pt")


# ---- non-finite loss in a real run --------------------------------------------------------------

def files_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def nan_at_steps(monkeypatch, steps: set[int], on_first=lambda: None):
    """Make the training loss NaN at the given optimizer steps (1-based; grad_accum=1); validation untouched."""
    real, calls = F.cross_entropy, {"n": 0}

    def cross_entropy(logits, y, *args, **kwargs):
        loss = real(logits, y, *args, **kwargs)
        if not logits.requires_grad:  # validation
            return loss
        calls["n"] += 1
        if calls["n"] in steps:
            if calls["n"] == min(steps):
                on_first()
            return loss * float("nan")
        return loss

    monkeypatch.setattr("vit.engine.F.cross_entropy", cross_entropy)


def test_nan_loss_stops_naming_the_step_and_leaves_checkpoints_intact(monkeypatch, tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    before = {}
    nan_at_steps(monkeypatch, {6}, on_first=lambda: before.update(files_digest(ckpt_dir)))
    cfg = compose_cfg("train", [*SYNTHETIC, f"out_dir={tmp_path}", "logger=none", "checkpoint.every_steps=2",
                                "checkpoint.keep_last=2"])
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss nan .* at step 6 \(epoch 1, step 6 of the "
                                                 r"epoch\); stopping .* The last checkpoint is intact"):
        train(cfg)
    assert sorted(before) == ["step_00000002.pt", "step_00000004.pt"]
    assert files_digest(ckpt_dir) == before  # byte for byte: nothing rewritten, added or half-written
    _, state = find_latest_checkpoint(ckpt_dir)
    assert state["step"] == 4 and all(torch.isfinite(t).all() for t in state["model"].values())


def test_nan_loss_with_skip_policy_skips_and_finishes(monkeypatch, tmp_path, capsys):
    nan_at_steps(monkeypatch, {3, 5})
    cfg = compose_cfg("train", [*SYNTHETIC, f"out_dir={tmp_path}", "logger=none", "nonfinite.policy=skip",
                                "nonfinite.max_skips=2"])
    result = train(cfg)
    out = capsys.readouterr().out
    assert "at step 3 (epoch 1, step 3 of the epoch): step skipped (1/2)" in out
    assert "at step 5 (epoch 1, step 5 of the epoch): step skipped (2/2)" in out
    ckpt = load_checkpoint(result["checkpoint"])
    assert result["steps"] == 8 and ckpt["nonfinite_skips"] == 2
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


# ---- malicious checkpoints ----------------------------------------------------------------------

def plant_malicious(path: Path, marker: Path) -> Path:
    """A torch.save file whose unpickling would run ``touch marker`` (os.system via __reduce__)."""

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": Evil(), "model_args": {}, "step": 1}, path, pickle_module=pickle)
    return path


def test_malicious_checkpoint_is_refused_everywhere_and_never_runs(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = plant_malicious(tmp_path / "evil.pt", marker)
    refused = r"cannot load checkpoint .*evil.pt safely: UnpicklingError.*weights_only"
    with pytest.raises(RuntimeError, match=refused):  # eval.py
        evaluate_checkpoint(compose_cfg("eval", [f"checkpoint={evil}", "logger=none", f"out_dir={tmp_path / 'e'}"]))
    with pytest.raises(RuntimeError, match=refused):  # train.py resume=<path>
        train(compose_cfg("train", [*SYNTHETIC, f"resume={evil}", "logger=none", f"out_dir={tmp_path / 'r'}"]))
    with pytest.raises(RuntimeError, match=refused):  # train.py init_from=<path>
        train(compose_cfg("train", [*SYNTHETIC, f"init_from={evil}", "logger=none", f"out_dir={tmp_path / 'i'}"]))
    # resume=auto: the planted file is the newest "checkpoint"; it is skipped (reported) and the run starts fresh
    plant_malicious(tmp_path / "auto" / "checkpoints" / "step_00000099.pt", marker)
    result = train(compose_cfg("train", [*SYNTHETIC, "resume=auto", "logger=none", f"out_dir={tmp_path / 'auto'}"]))
    assert "skipping unreadable" in capsys.readouterr().out and result["steps"] == 8
    assert not marker.exists()


# ---- secrets -------------------------------------------------------------------------------------

def test_environment_secrets_never_reach_the_logged_config(monkeypatch, tmp_path):
    """WANDB_API_KEY and a *_TOKEN are set and the config even interpolates both; the offline W&B run's
    files (config.yaml, metadata, the .wandb log) hold neither value."""
    key, token = "wandb-secret-" + os.urandom(8).hex(), "token-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("MY_SERVICE_TOKEN", token)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg("train", [*SYNTHETIC, f"out_dir={tmp_path / 'out'}", "logger=wandb",
                                "+logger.api_key=${oc.env:WANDB_API_KEY}", "+note=from-${oc.env:MY_SERVICE_TOKEN}"])
    result = train(cfg)
    run_file = next(Path(result["wandb_dir"]).glob("run-*.wandb"))  # the run config is one of its records
    for _ in range(300):  # W&B's service process may still be flushing it on a busy machine
        if b"from-<redacted>" in run_file.read_bytes():
            break
        time.sleep(0.1)
    assert b"'api_key': '<redacted>'" in (run_file.parent / "logs" / "debug.log").read_bytes()
    assert b"from-<redacted>" in run_file.read_bytes()  # the keys are logged, the values are not
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 4  # the .wandb log, debug logs (they print the config), output.log, checkpoints, ...
    assert any(p.suffix == ".pt" for p in files)  # checkpoints hold the config too (stored uncompressed)
    for p in files:
        data = p.read_bytes()
        assert key.encode() not in data and token.encode() not in data, f"a secret leaked into {p}"
