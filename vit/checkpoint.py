"""Checkpoints: atomic save, safe load, newest-complete lookup, keep-last-K, keep-best-N, timm import, RNG state.

A checkpoint is one ``torch.save`` file of plain containers and tensors::

    {"format": 1, "model": state_dict, "optimizer": ..., "epoch": int, "step": int,
     "step_in_epoch": int, "sampler": {"epoch", "position"}, "rng": {...}, "best_top1": float,
     "metrics": {...}, "config": resolved config dict, "model_args": {...}, "classes": [...]}

``epoch`` is the number of finished epochs; ``step`` the number of finished optimizer steps;
``step_in_epoch`` > 0 marks a mid-epoch checkpoint. It is written to a temporary file, fsynced and
renamed over the final name, so a crash at any moment leaves either the old file or the new one.
It is read with ``torch.load(weights_only=True)``, which refuses to run code from the file.

Test hook (inert unless set): ``VIT_TEST_CRASH_AT=<event>:<n>`` makes :func:`crash_point` SIGKILL the
process the n-th time it reaches ``event`` (``save``: temp file written, not yet renamed; ``saved``:
checkpoint complete; ``step``: inside an optimizer step; ``val``: inside validation). The crash/resume
test (tests/test_crash_resume.py) uses it to kill a training run at exact points.
"""
from __future__ import annotations

import os
import random
import re
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from vit.logger import info

FORMAT = 1
STEP_FILE = re.compile(r"^step_(\d{8})\.pt$")
TOP_FILE = re.compile(r"^top1_(\d+\.\d+)_step_(\d{8})\.pt$")  # checkpoint.keep_best's files
TEMP_FILE = re.compile(r"^\.(step_\d{8}|best|top1_\d+\.\d+_step_\d{8})\.pt\.tmp(\d+)$")  # save_checkpoint's temp names
_crash_counts: dict[str, int] = {}


def crash_point(event: str) -> None:
    """SIGKILL this process at the n-th ``event`` if ``VIT_TEST_CRASH_AT=<event>:<n>`` (tests only; a no-op
    when the variable is unset)."""
    spec = os.environ.get("VIT_TEST_CRASH_AT")
    if not spec or spec.partition(":")[0] != event:
        return
    _crash_counts[event] = _crash_counts.get(event, 0) + 1
    if _crash_counts[event] == int(spec.partition(":")[2] or 1):
        print(f"[test] VIT_TEST_CRASH_AT={spec}: SIGKILL", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    crash_point("save")
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    crash_point("saved")
    return path


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint on CPU without unpickling code (``weights_only=True``).

    Raises:
        FileNotFoundError: no file at ``path``.
        RuntimeError: the file holds objects other than tensors and plain containers (refused,
            nothing executed) or is not a checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError, RuntimeError from a truncated zip, ...
        raise RuntimeError(f"cannot load checkpoint {path} safely: {type(e).__name__}: {e}. Only files holding "
                           f"tensors and plain containers are accepted (torch.load(weights_only=True))") from e


def step_checkpoint_path(ckpt_dir: str | os.PathLike, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.pt"


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """``step_XXXXXXXX.pt`` files in ``ckpt_dir``, oldest step first (temp files excluded)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted((p for p in ckpt_dir.iterdir() if STEP_FILE.match(p.name)), key=lambda p: p.name)


def find_latest_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[Path, dict] | None:
    """(path, state) of the newest checkpoint in ``ckpt_dir`` that loads, or None; unreadable ones
    are reported and skipped."""
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            return path, load_checkpoint(path)
        except RuntimeError as e:
            info(f"[checkpoint] skipping unreadable {path}: {e}")
    return None


def prune_checkpoints(ckpt_dir: str | os.PathLike, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (``keep_last <= 0`` keeps all), and
    temp files left by killed writers (other processes' ``.step_*.pt.tmp<pid>`` / ``.best.pt.tmp<pid>``)."""
    ckpt_dir = Path(ckpt_dir)
    for path in ckpt_dir.iterdir() if ckpt_dir.is_dir() else []:
        match = TEMP_FILE.match(path.name)
        if match and int(match.group(2)) != os.getpid():
            path.unlink(missing_ok=True)
    if keep_last <= 0:
        return
    for path in list_checkpoints(ckpt_dir)[:-keep_last]:
        path.unlink(missing_ok=True)


def save_best(ckpt_dir: str | os.PathLike, content: dict, top1: float, step: int, improved: bool,
              keep_best: int) -> None:
    """Write the epoch's weights-only ``content`` as ``best.pt`` if ``improved``, and keep the ``keep_best``
    checkpoints of highest val ``top1`` (%) as ``top1_<top1>_step_<step>.pt`` (``checkpoint.keep_best``; 0: none).
    A new one enters when fewer are kept or it beats the lowest (ties keep the earlier); the lowest is deleted."""
    ckpt_dir = Path(ckpt_dir)
    if improved:
        save_checkpoint(ckpt_dir / "best.pt", content)
    if keep_best <= 0:
        return
    kept = [(float(m.group(1)), int(m.group(2)), p) for p in (ckpt_dir.iterdir() if ckpt_dir.is_dir() else [])
            if (m := TOP_FILE.match(p.name))]
    if len(kept) >= keep_best and top1 <= min(t for t, _, _ in kept):
        return
    path = save_checkpoint(ckpt_dir / f"top1_{top1:.4f}_step_{step:08d}.pt", content)
    for _, _, old in sorted([*kept, (top1, step, path)], key=lambda e: (-e[0], e[1]))[keep_best:]:
        old.unlink(missing_ok=True)


def capture_rng_state() -> dict:
    """torch (CPU and every CUDA device), numpy and python RNG states as tensors and plain lists."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def timm_pretrained_state_dict(name: str, margs: dict, file: str | os.PathLike | None = None) -> dict:
    """timm's pretrained weights for model ``name`` (e.g. ``vit_base_patch16_224.augreg_in21k_ft_in1k``) through
    ``timm.create_model(pretrained=True)``: downloaded into timm's cache when online, read from ``file`` (timm's
    ``pretrained_cfg_overlay=dict(file=...)``) when given. Built at this run's ``img_size`` (timm resamples the
    position embedding) and ``num_classes`` (a head of another size is left at timm's initialisation, as timm
    does for fine-tuning).

    Raises:
        ValueError: timm has no model ``name``.
        RuntimeError: the weights could not be fetched (offline without ``file``, or a bad file); says what to pass.
    """
    import timm

    overlay = {"file": str(file)} if file else None
    try:
        model = timm.create_model(name, pretrained=True, num_classes=margs["num_classes"], img_size=margs["img_size"],
                                  pretrained_cfg_overlay=overlay)
    except RuntimeError as e:
        if "Unknown model" not in str(e):
            raise
        raise ValueError(f"init_from=timm:{name}: timm has no model {name!r}; timm.list_models('vit_*', "
                         f"pretrained=True) lists those with weights") from e
    except OSError as e:  # no network, no cached copy, or an unreadable file
        raise RuntimeError(f"init_from=timm:{name}: timm could not load its pretrained weights ({type(e).__name__}: "
                           f"{e}); offline, download them where there is a network and pass "
                           f"init_from_file=<the .safetensors or .pth file>") from e
    return model.state_dict()


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A bare model state dict (e.g. timm's): ``.safetensors``, or a torch file loaded with
    ``weights_only=True``; a checkpoint of ours, or a dict under ``state_dict``/``model``, is unwrapped."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    obj = load_checkpoint(path)
    for key in ("model", "state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            return obj[key]
    return obj


def load_model_weights(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy ``state_dict`` into ``model`` strictly, resizing ``pos_embed`` to the model's grid.

    The position embedding of another image size is resampled bicubically (timm's
    ``resample_abs_pos_embed``), so a 224 px checkpoint fine-tunes at 384 px; a fixed one
    (``pos_embed='sincos2d'``, not trained) is the model's own, computed for its grid.

    Raises:
        RuntimeError: missing or unexpected keys, or other shape mismatches (another model size);
            the message names them.
    """
    from timm.layers import resample_abs_pos_embed

    state_dict = dict(state_dict)
    own = model.state_dict()
    pos = state_dict.get("pos_embed")
    want = own.get("pos_embed")
    if pos is not None and want is not None and pos.shape != want.shape and pos.shape[-1] == want.shape[-1]:
        prefix = getattr(model, "num_prefix_tokens", 1)  # the class token's row, kept as is
        side = round((pos.shape[1] - prefix) ** 0.5)
        if side * side != pos.shape[1] - prefix:
            raise RuntimeError(f"{source}: its pos_embed has {pos.shape[1] - prefix} patch positions, not a square "
                               f"grid, so its grid is unknown; load it at the image size it was made for")
        old_grid, new_grid = [side, side], list(model.patch_embed.grid)
        if not model.pos_embed.requires_grad:  # fixed sin-cos: the model's own for the new grid
            state_dict["pos_embed"] = want
        else:
            state_dict["pos_embed"] = resample_abs_pos_embed(pos, new_grid, old_grid, num_prefix_tokens=prefix,
                                                             interpolation="bicubic")
        info(f"[checkpoint] {'resized' if model.pos_embed.requires_grad else 'recomputed the fixed'} pos_embed "
             f"from a {side}×{side} to a {new_grid[0]}×{new_grid[1]} patch grid")
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    mismatched = [f"{k}: {tuple(state_dict[k].shape)} in {source}, {tuple(own[k].shape)} in model"
                  for k in sorted(set(own) & set(state_dict)) if state_dict[k].shape != own[k].shape]
    if missing or unexpected or mismatched:
        lines = [f"{source} does not fit the model:"]
        if mismatched:
            lines.append(f"  shape mismatches (another model size, patch size or number of classes?): "
                         f"{'; '.join(mismatched[:6])}{' ...' if len(mismatched) > 6 else ''}")
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing[:10])}"
                         f"{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected[:10])}"
                         f"{' ...' if len(unexpected) > 10 else ''}")
        lines.append("  pick the model=/model.* values the weights were made with")
        raise RuntimeError("\n".join(lines))
    model.load_state_dict(state_dict, strict=True)
