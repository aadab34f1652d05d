"""What is alive at the peak of a CUDA step: replay of the caching allocator's trace, by site.

``max_memory_allocated`` says how high a step goes; this says with what. :func:`record` runs a
function under ``torch.cuda.memory._record_memory_history`` (PyTorch's allocator trace, the data
behind https://pytorch.org/memory_viz), :func:`peak_sites` replays the trace's alloc and free events,
finds the moment the bytes allocated *during the step* peak, and groups the blocks alive then by the
Python line that allocated them (for ``torch.compile`` that is a line of Inductor's generated code,
which names the buffer; in eager mode autograd's C++ allocates the backward's buffers, so they all
point at the ``loss.backward()`` caller). Used by ``python -m benchmarks.train --memory-peak``.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

import torch

# Frames from these paths are PyTorch's plumbing, not the allocation's cause; Inductor's generated
# code (torchinductor_*) is kept, as it names the buffer.
_PLUMBING = ("/torch/", "/triton/", "<frozen ", "/functools.py", "/contextlib.py")


def site_of(frames: Iterable[dict]) -> str:
    """``file:line function`` of the innermost Python frame that is not PyTorch/Triton plumbing.

    ``frames`` is a trace event's ``frames`` list (innermost first), each with ``filename``,
    ``line`` and ``name``; C++ frames (no ``.py`` file) are skipped. Returns ``"?"`` when every
    frame is plumbing or none was recorded.
    """
    for f in frames:
        name = f.get("filename", "")
        if not name.endswith(".py"):
            continue
        if "torchinductor" in name or not any(p in name for p in _PLUMBING):
            return f"{name.rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name')}"
    return "?"


def peak_sites(events: Iterable[dict], top: int = 12) -> dict:
    """Replay allocator ``events`` and describe the peak of the bytes allocated after the first.

    Args:
        events: ``snapshot["device_traces"][i]`` of ``torch.cuda.memory._snapshot()``: dicts with
            ``action`` ("alloc", "free_completed", ...), ``addr``, ``size`` (bytes) and ``frames``.
        top: how many sites to return, largest first.

    Returns:
        ``{"peak_bytes": int, "sites": [(site, blocks, bytes), ...]}``: the bytes allocated at the
        peak by blocks the trace saw allocated (blocks that predate the trace are not counted), and
        those blocks grouped by :func:`site_of`.
    """
    live: dict[int, dict] = {}
    total = peak = 0
    at_peak: dict[int, dict] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    grouped: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in at_peak.values():
        g = grouped[site_of(e.get("frames", []))]
        g[0] += 1
        g[1] += e["size"]
    sites = sorted(((s, n, b) for s, (n, b) in grouped.items()), key=lambda x: -x[2])[:top]
    return {"peak_bytes": peak, "sites": sites}


def record(fn: Callable[[], object], max_entries: int = 1_000_000) -> list[dict]:
    """Run ``fn()`` once under the allocator trace; return the current device's trace events.

    Raises:
        RuntimeError: no CUDA GPU (the trace is the CUDA caching allocator's).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("the memory trace needs a CUDA GPU (it records the CUDA caching allocator)")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=max_entries)
    try:
        fn()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return snapshot["device_traces"][torch.cuda.current_device()]


def render(rows: Iterable[dict]) -> str:
    """Markdown: per configuration row with ``peak_sites``, the sites alive at the step's peak."""
    out = []
    for r in rows:
        info = r.get("peak_sites")
        if not info:
            continue
        out.append(f"\n### {r['model']} {r['impl']} {r['attention']} compile={r['compile']}: "
                   f"{info['peak_bytes'] / 2**30:.3f} GiB allocated during the step at its peak\n")
        out.append("| allocated at | blocks | GiB |\n|---|---|---|")
        out += [f"| `{s}` | {n} | {b / 2**30:.3f} |" for s, n, b in info["sites"]]
    return "\n".join(out) + ("\n" if out else "")
