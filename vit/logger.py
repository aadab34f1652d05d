"""Run logging: the same numbers to the console and to Weights & Biases (rank 0 only).

W&B keys (``train/*`` every ``log_every`` optimizer steps, ``val/*`` every epoch)::

    train/loss  train/lr  train/grad_norm  train/images_per_s  train/tokens_per_s
    train/step_time_ms  train/data_wait_ms  train/peak_mem_allocated_mb  train/peak_mem_reserved_mb
    val/loss  val/top1  val/top5  val/images_per_s  val/peak_mem_allocated_mb  val/peak_mem_reserved_mb
    epoch  (and the summary key ``backend``)

Rates are over the window since the last log; peak memory is since the last log (0 on CPU).
The run config is the resolved Hydra config plus ``env`` (GPU, versions, backend); no environment
variables are copied into it, and :func:`scrub_secrets` redacts secrets a config may hold.
``logger=none`` keeps the console output and writes no W&B run.
Every logged line is also appended to ``out_dir/metrics.jsonl`` (``{"step": ..., key: value, ...}``)
and kept in ``RunLogger.records``, whatever the logger, for scripts and tests to read.
Resuming (``resume_step``, ``run_id``): the lines past the checkpoint's step are dropped from
``metrics.jsonl`` (the resumed run logs those steps again, so each step appears once), and W&B continues
the checkpoint's run (``wandb.init(id=..., resume="allow")``); offline, each segment is its own
``offline-run-*-<id>`` folder, and ``wandb sync`` of them all uploads one run.
"""
from __future__ import annotations

import contextlib
import csv
import importlib.metadata
import json
import logging
import os
import platform
import sys
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from tqdm.contrib.logging import logging_redirect_tqdm

console = logging.getLogger("vit")  # every console line of a run; Hydra's job logging also writes it to train.log
console.setLevel(logging.INFO)
TIMED = logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s")


def info(msg: str) -> None:
    """One console line, through logging (logger ``vit``), so the run folder's ``train.log`` holds it too;
    printed outside Hydra and :func:`console_log` (nothing else would show it)."""
    if console.handlers or HydraConfig.initialized():
        console.info(msg)
    else:
        print(msg)


class RunLogFile(logging.FileHandler):
    """``train.log`` with time and level, created (with its folder) at the first line, so a run that fails its
    checks before logging anything leaves no folder behind."""

    def __init__(self, path: Path):
        super().__init__(path, delay=True)
        self.setFormatter(TIMED)

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


@contextlib.contextmanager
def console_log(out_dir: Path, write_file: bool = True):
    """Route the ``vit`` logger's lines for the duration of a run: under Hydra, its job logging prints them
    and writes ``<Hydra run dir>/train.log`` (configs/hydra/job_logging/plain.yaml), Python warnings
    included; without Hydra (tests, library calls) a stdout handler prints them. With ``write_file``,
    ``out_dir/train.log`` gets them too when it is not Hydra's file. tqdm bars are kept intact
    (``logging_redirect_tqdm``)."""
    hydra_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    handlers = [] if hydra_dir else [logging.StreamHandler(sys.stdout)]
    if write_file and hydra_dir != Path(out_dir):
        handlers.append(RunLogFile(Path(out_dir) / "train.log"))
    for handler in handlers:
        console.addHandler(handler)
    logging.captureWarnings(hydra_dir is not None)
    try:
        with logging_redirect_tqdm(loggers=[console] if hydra_dir is None else [logging.getLogger()]):
            yield
    finally:
        logging.captureWarnings(False)
        for handler in handlers:
            console.removeHandler(handler)
            handler.close()


def environment(backend: str, device: torch.device) -> dict:
    """Versions and hardware, for the run config."""
    env = {"backend": backend, "device": str(device), "torch": torch.__version__, "python": platform.python_version(),
           "cpu_threads": torch.get_num_threads()}
    try:  # the installed version, without importing triton (whose mode depends on TRITON_INTERPRET at import)
        env["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        env["triton"] = None
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   gpu_count=torch.cuda.device_count())
    return env


SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def scrub_secrets(obj, secrets: list[str] | None = None):
    """``obj`` (nested dicts/lists/strings) with secrets replaced by ``"<redacted>"``: the value under any
    key whose name contains KEY, TOKEN, SECRET or PASSWORD (any case), and, anywhere in a string, the
    value (8+ characters) of any environment variable so named, e.g. ``WANDB_API_KEY``."""
    if secrets is None:
        secrets = [v for k, v in os.environ.items() if any(w in k.upper() for w in SECRET_WORDS) and len(v) >= 8]
    if isinstance(obj, dict):
        return {k: "<redacted>" if any(w in str(k).upper() for w in SECRET_WORDS) and v is not None
                else scrub_secrets(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_secrets(v, secrets) for v in obj]
    if isinstance(obj, str):
        for secret in secrets:
            obj = obj.replace(secret, "<redacted>")
    return obj


def format_metrics(metrics: dict) -> str:
    parts = []
    for k, v in metrics.items():
        name = k.split("/", 1)[-1]
        parts.append(f"{name} {v:.4g}" if isinstance(v, float) else f"{name} {v}")
    return "  ".join(parts)


def trim_metrics(path: Path, last_step: int) -> int:
    """Drop the lines of ``metrics.jsonl`` logged after optimizer step ``last_step`` (a resumed run logs them
    again), rewriting the file atomically; return how many were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= last_step]
    if len(kept) < len(lines):
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return len(lines) - len(kept)


def sweep_identity(argv: list[str] | None = None) -> dict:
    """W&B names for a job of a Hydra multirun (``-m attention=naive,sdpa``), {} otherwise: ``group`` the sweep
    (its folder, ``hydra.sweep.dir``), ``tags`` ``key=value`` of the keys the sweep varies (read from the command
    line ``argv``, default ``sys.argv``), ``name`` those joined (``attention=sdpa``; all of the job's overrides,
    ``hydra.job.override_dirname``, if none is known), so the runs of one sweep compare side by side."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return {}
    hydra = HydraConfig.get()
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    try:
        varying = {o.key_or_group for o in OverridesParser.create().parse_overrides(words) if o.is_sweep_override()}
    except OverrideParseException:  # a launcher's own argv: no sweep keys to read, the run name still says it all
        varying = set()
    tags = [o for o in hydra.overrides.task if o.split("=", 1)[0].lstrip("+~") in varying]
    name = ",".join(tags) or hydra.job.override_dirname or hydra.job.name
    return {"group": str(hydra.sweep.dir), "name": name, "tags": tags}


class RunLogger:
    """Console + optional W&B run. Non-zero ranks print nothing and log nothing.

    Args:
        cfg: the ``logger`` config (``name``: wandb|none, ``project``, ``mode``: offline|online|disabled,
            ``run_name``, ``group``, ``tags``; see :func:`sweep_identity` for their multirun defaults).
        out_dir: the run's output folder; W&B writes under ``out_dir/wandb``.
        run_config: resolved config dict (with ``env``) stored as the W&B run config.
        rank: process rank; only rank 0 logs.
    """

    def __init__(self, cfg, out_dir: str | os.PathLike, run_config: dict, rank: int = 0,
                 resume_step: int | None = None, run_id: str | None = None):
        self.rank, self.run, self.records = rank, None, []
        self.jsonl = Path(out_dir) / "metrics.jsonl"
        if rank != 0:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            trim_metrics(self.jsonl, resume_step)
        if cfg.name == "none":
            return
        import wandb

        sweep = sweep_identity()
        self.run = wandb.init(project=cfg.project, name=cfg.run_name or sweep.get("name"),
                              group=cfg.get("group") or sweep.get("group"),
                              tags=[*(cfg.tags or []), *sweep.get("tags", [])], mode=cfg.mode,
                              dir=str(out_dir), config=scrub_secrets(run_config), reinit="finish_previous",
                              id=run_id, resume="allow" if run_id else None)
        self.run.define_metric("val/*", step_metric="epoch")
        self.run.summary["backend"] = run_config.get("env", {}).get("backend")

    @property
    def run_id(self) -> str | None:
        """The W&B run's id (kept in checkpoints, so a resumed run continues the same W&B run), or None."""
        return self.run.id if self.run is not None else None

    @property
    def run_dir(self) -> str | None:
        """The local W&B run folder (``.../wandb/offline-run-*`` in offline mode), or None."""
        return self.run.dir.rsplit("/files", 1)[0] if self.run is not None else None

    def print(self, msg: str) -> None:
        if self.rank == 0:
            info(msg)

    def log(self, metrics: dict, step: int, prefix: str = "") -> None:
        """Print ``metrics`` on one line and send them to W&B at optimizer step ``step``."""
        if self.rank != 0:
            return
        self.print(f"{prefix}step {step}  {format_metrics(metrics)}")
        self.records.append({"step": step, **metrics})
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(self.records[-1]) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def append_summary_csv(path: str | os.PathLike, row: dict) -> None:
    """Append one epoch to ``summary.csv`` in timm's format (``timm.utils.update_summary``: columns
    ``epoch, train_loss, eval_loss, eval_top1, eval_top5[, eval_ema_*], lr``); ``row`` holds ``epoch``,
    ``train_loss``, ``lr`` and the ``val``/``val_ema`` metric dicts. A header is written into a new file."""
    from timm.utils import update_summary

    evals = {**{k: row["val"][k] for k in ("loss", "top1", "top5")},
             **{f"ema_{k}": row["val_ema"][k] for k in ("loss", "top1", "top5") if row["val_ema"]}}
    new = not os.path.exists(path) or os.path.getsize(path) == 0  # explicit: timm 1.0.29 writes no header by default
    update_summary(row["epoch"], {"loss": row["train_loss"]}, evals, str(path), lr=row["lr"], write_header=new)


def trim_summary_csv(path: str | os.PathLike, finished_epochs: int) -> None:
    """Drop ``summary.csv`` rows past ``finished_epochs`` (a resumed run writes them again; a fresh run,
    0, starts a new file), rewriting it atomically. (timm 1.0.31's ``trim_summary`` does this; 1.0.29 has none.)"""
    path = Path(path)
    if not path.exists():
        return
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    keep = [r for r in body if r and int(float(r[0])) <= finished_epochs]
    if len(keep) == len(body):
        return
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        if keep:
            csv.writer(f).writerows([header, *keep])
    os.replace(tmp, path)
