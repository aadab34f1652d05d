"""Figures from benchmark rows: the FlashAttention claim, time and memory against sequence length.

    python -m benchmarks.plots benchmarks/results/attention_baseline.json   # redraw from saved JSON

For each (dtype, head_dim): forward+backward time and peak memory, both divided by B·H so shapes
with different batch and head counts line up (per sequence and head, naive attention grows as N²
in both; a FlashAttention kernel's memory grows as N), and naive's time over each backend's.
Log axes; a backend without a result is listed under the figure with its error.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def plot_attention(rows: list[dict], path: Path, title: str) -> Path | None:
    """Per dtype and head_dim: fwd+bwd time and peak memory per (sequence·head) vs N, and speedup vs naive."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["dtype"], r["d"]) for r in rows})
    if not groups:
        return None
    fig, axes = plt.subplots(len(groups), 3, figsize=(16, 4.6 * len(groups)), squeeze=False)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    failed: dict[tuple[str, str], list[str]] = {}  # (backend, status) -> shapes, listed under the figure
    for (dtype, d), (ax_t, ax_m, ax_s) in zip(groups, axes):
        for b in backends:
            sel = [r for r in rows if r["backend"] == b and r["dtype"] == dtype and r["d"] == d]
            ok = [r for r in sel if r.get("fwdbwd_ms") is not None]
            for r in sel:
                if r["status"] != "ok":
                    failed.setdefault((b, r["status"][:110]), []).append(f"{dtype}/d{d}/N{r['N']}")
            if not ok:
                continue
            ns = sorted({r["N"] for r in ok})

            def series(key, per_bh, ok=ok, ns=ns):
                ys = []
                for n in ns:
                    vals = [r[key] / (r["B"] * r["H"] if per_bh else 1) for r in ok if r["N"] == n and r.get(key)]
                    ys.append(statistics.median(vals) if vals else float("nan"))
                return ys

            style = {"marker": "o", "label": b, "linestyle": "--" if b == "naive" else "-"}
            for ax, key, per_bh in ((ax_t, "fwdbwd_ms", True), (ax_m, "fwdbwd_peak_mib", True),
                                    (ax_s, "speedup_vs_naive", False)):
                ys = series(key, per_bh)
                if any(math.isfinite(y) and y > 0 for y in ys):
                    ax.plot(ns, ys, **style)
        for ax, ylabel in ((ax_t, "fwd+bwd ms per (sequence·head)"), (ax_m, "peak fwd+bwd MiB per (sequence·head)"),
                           (ax_s, "naive fwd+bwd time / backend's")):
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{dtype}, head_dim {d}")
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:  # log axes need positive data; an empty panel says why instead
                ax.set_xscale("log", base=2)
                ax.set_yscale("log" if ax is not ax_s else "linear")
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "no data (memory is n/a on CPU)" if ax is ax_m else "no data",
                        transform=ax.transAxes, ha="center")
    lines = [f"no result: {b} ({', '.join(shapes[:4])}{' …' if len(shapes) > 4 else ''}): {status}"
             for (b, status), shapes in failed.items()][:8]
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, color="darkred", va="bottom")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.018 * len(lines) * (2 / len(groups)) ** 0.5, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    """Redraw ``<name>.png`` beside each given ``<name>.json`` written by ``benchmarks.attention``."""
    for path in map(Path, sys.argv[1:] if argv is None else argv):
        data = json.loads(path.read_text())
        env = data["environment"]
        title = f"{env['command']}\n{env['gpu'] or 'CPU (wall-clock)'} · torch {env['torch']} · {env['date_utc']}"
        print(plot_attention(data["rows"], path.with_suffix(".png"), title))


if __name__ == "__main__":
    main()
