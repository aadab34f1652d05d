"""Figures of analyze.py (matplotlib, no display needed): per-head statistics by layer, and attention maps.

:func:`plot_per_head` draws what Dosovitskiy et al. 2021, Fig. 7 draws: layer on x, one dot per head.
:func:`plot_maps` overlays attention maps on the images they came from, one row per image.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure


def plot_per_head(values: np.ndarray, ylabel: str, title: str, path: Path, reference: tuple[float, str] | None = None):
    """Scatter of ``values`` (layers × heads): x = layer (1-based), one dot per head, coloured by head.

    ``reference``: ``(y, label)`` of a dashed horizontal line (e.g. the entropy of uniform attention).
    Writes a PNG to ``path`` and returns it.
    """
    layers, heads = values.shape
    fig = Figure(figsize=(max(6.0, 0.45 * layers + 3.0), 4.0), layout="constrained")
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["tab10" if heads <= 10 else "tab20"]
    colors = [cmap(h % cmap.N) for h in range(heads)]
    x = np.arange(1, layers + 1)
    for h in range(heads):
        ax.scatter(x, values[:, h], s=18, color=colors[h], label=f"head {h + 1}")
    if reference is not None:
        ax.axhline(reference[0], color="grey", linestyle="--", linewidth=1, label=reference[1])
    ax.set_xlabel("layer (network depth)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(x)
    top = max(float(np.nanmax(values)), reference[0] if reference is not None else 0.0)
    ax.set_ylim(0, 1.08 * top if top > 0 else 1.0)
    ax.grid(alpha=0.3)
    if heads <= 16:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.savefig(path, dpi=120)
    return path


def _overlay(ax, image: np.ndarray, attn: np.ndarray, title: str | None) -> None:
    """``image`` (h, w, 3) in [0, 1] under ``attn`` (grid_h, grid_w), one block per patch: stretched from its min to max,
    coloured with ``jet`` and opaque in proportion (the least attended patches show the image, the most are red)."""
    extent = (0, image.shape[1], image.shape[0], 0)
    ax.imshow(image, extent=extent)
    norm = (attn - attn.min()) / max(float(attn.max() - attn.min()), 1e-12)
    rgba = matplotlib.colormaps["jet"](norm)
    rgba[..., 3] = 0.1 + 0.7 * norm
    ax.imshow(rgba, extent=extent, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8)


def plot_maps(images: torch.Tensor, maps: torch.Tensor, rollout: torch.Tensor | None, labels: list[str],
              path: Path, map_title: str):
    """Grid: per image (row), the image, its attention rollout (when given) and each head's last-layer map.

    Args:
        images: ``(M, 3, h, w)`` float in [0, 1].
        maps: ``(M, H, grid_h, grid_w)`` attention of the last layer's class token (or mean row) to each patch.
        rollout: ``(M, grid_h, grid_w)`` or None.
        labels: one row label per image (e.g. its class).
        map_title: what the per-head columns show, for their titles.
    Writes a PNG to ``path`` and returns it; each map's colours span its own min (clear) to max (red).
    """
    m, heads = maps.shape[:2]
    cols = 1 + (rollout is not None) + heads
    fig = Figure(figsize=(1.6 * cols, 1.7 * m + 0.6), layout="constrained")
    axes = fig.subplots(m, cols, squeeze=False)
    for i in range(m):
        img = images[i].permute(1, 2, 0).clamp(0, 1).cpu().numpy()
        axes[i, 0].imshow(img)
        axes[i, 0].set_xticks([])
        axes[i, 0].set_yticks([])
        axes[i, 0].set_ylabel(labels[i], fontsize=8)
        if i == 0:
            axes[i, 0].set_title("image", fontsize=8)
        col = 1
        if rollout is not None:
            _overlay(axes[i, 1], img, rollout[i].float().cpu().numpy(), "rollout" if i == 0 else None)
            col = 2
        for h in range(heads):
            _overlay(axes[i, col + h], img, maps[i, h].float().cpu().numpy(), f"head {h + 1}" if i == 0 else None)
    rollout_note = ", rollout (Abnar & Zuidema 2020)" if rollout is not None else ""
    fig.suptitle(f"{map_title}{rollout_note}\neach map from its least (clear) to its most attended patch (red)",
                 fontsize=9)
    fig.savefig(path, dpi=120)
    return path
