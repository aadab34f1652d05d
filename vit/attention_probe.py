"""What each attention layer of a ViT forward did: per-head statistics, class-token maps, attention rollout.

:class:`AttentionProbe` swaps every block's attention callable (``block.attn.attn_fn``, the model's only
link to a kernel) for one that computes the layer's output *and* its statistics, and puts the original
back on exit. The statistics come from one of two kernels with the same outputs:

- ``flash``: :func:`kernels.flash.stats.attention_stats`, fused into the FlashAttention-2 forward, O(N)
  memory (a CUDA GPU, or Triton's interpreter);
- ``naive``: :func:`kernels.naive.attention_stats`, which materialises P (any device; the reference).

Per layer and image, per head: the mean attention distance over the patch query rows (pixels; the class
token's row is left out and its column counts distance 0, the definition in :mod:`kernels.flash.stats`),
the mean entropy over all query rows (nats) and the largest logit q·k·softmax_scale.

Maps (``maps=True``): the last layer's attention from the class token to each patch, per head (with
``global_pool='avg'``, no class token: the mean over all query rows), computed one query row (or chunk)
at a time, O(N) memory. Rollout (``rollout=True``; Abnar & Zuidema 2020, "Quantifying Attention Flow in
Transformers", eq. for attention rollout): Ã_l = 0.5·mean_heads(P_l) + 0.5·I, rows renormalised, and
R = Ã_L ⋯ Ã_1; its class-token row (or mean row) over the patches is the map. It needs each layer's
N×N matrix, so it runs the naive kernel and is refused above :data:`MAX_ROLLOUT_TOKENS`.
"""
from __future__ import annotations

import functools

import torch

from kernels import split_qkv

MAX_ROLLOUT_TOKENS = 1025  # 512 px at patch 16: a ViT-B's 12 head-mean matrices for 4 images take 200 MB
QUERY_CHUNK = 1024  # query rows per softmax when averaging maps over all rows (avg-pool models)


def stats_kernel(name: str, device: torch.device):
    """The statistics function for ``stats=<name>``: ``auto`` is flash on CUDA, naive elsewhere.

    Raises:
        ValueError: a name other than auto, flash, naive.
    """
    if name == "auto":
        name = "flash" if device.type == "cuda" else "naive"
    if name == "flash":
        from kernels.flash.stats import attention_stats
    elif name == "naive":
        from kernels.naive import attention_stats
    else:
        raise ValueError(f"stats={name!r}: use auto, flash (fused Triton kernel, O(N) memory) or naive (materialises P)")
    return name, attention_stats


def rollout_step(rollout: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor:
    """One layer of attention rollout: ``Ã @ rollout`` with Ã = 0.5·mean_heads(probs) + 0.5·I, rows renormalised.

    Args:
        rollout: ``(B, N, N)`` float32 product of the layers below, or None at the first layer.
        probs: ``(B, H, N, N)`` attention probabilities of this layer.
    """
    a = 0.5 * probs.float().mean(1) + 0.5 * torch.eye(probs.shape[-1], device=probs.device)
    a = a / a.sum(-1, keepdim=True)
    return a if rollout is None else a @ rollout


def query_attention(q: torch.Tensor, k: torch.Tensor, rows: int, softmax_scale: float) -> torch.Tensor:
    """``(B, H, N)`` float32: softmax(q kᵀ·scale) averaged over the first ``rows`` query rows, in chunks."""
    total = torch.zeros(q.shape[:2] + (k.shape[2],), dtype=torch.float32, device=q.device)
    for chunk in q[:, :, :rows].split(QUERY_CHUNK, dim=2):
        total += (chunk.float() @ k.float().transpose(-2, -1) * softmax_scale).softmax(-1).sum(2)
    return total / rows


class AttentionProbe:
    """Context manager; inside it each ``model(x)`` fills :attr:`distance`, :attr:`entropy`, :attr:`max_logit`
    (one ``(B, H)`` float32 tensor per layer, on the model's device) and, when asked, :attr:`maps`
    (``(B, H, grid_h, grid_w)``) and :attr:`rollout` (``(B, grid_h, grid_w)``). One forward per ``with``.

    Args:
        model: a :class:`vit.model.VisionTransformer` (not wrapped by DDP/compile: pass the module itself).
        stats: ``auto``, ``flash`` or ``naive`` (:func:`stats_kernel`).
        maps: record the last layer's class-token attention per head.
        rollout: record attention rollout (naive kernel; N ≤ :data:`MAX_ROLLOUT_TOKENS`).

    Raises:
        ValueError: rollout above :data:`MAX_ROLLOUT_TOKENS` tokens; an unknown ``stats`` name.
    """

    def __init__(self, model, stats: str = "auto", maps: bool = False, rollout: bool = False):
        self.model, self.want_maps, self.want_rollout = model, maps, rollout
        embed = model.patch_embed
        self.grid = tuple(embed.grid)  # (grid_h, grid_w): a rectangular image has a rectangular grid
        self.patch_size, self.prefix = embed.patch_size, model.num_prefix_tokens
        n = self.prefix + self.grid[0] * self.grid[1]
        if rollout and n > MAX_ROLLOUT_TOKENS:
            raise ValueError(f"attention rollout multiplies every layer's N×N attention matrix, and this model has "
                             f"N={n} tokens ({embed.img_size} px at patch {embed.patch_size}), above the "
                             f"{MAX_ROLLOUT_TOKENS} allowed; pass maps.rollout=false (distance, entropy and the "
                             f"class-token maps need O(N) memory only) or a smaller data.img_size")
        device = next(model.parameters()).device
        self.stats_name, self.stats_fn = stats_kernel(stats, device)
        if rollout:
            from kernels.naive import attention_stats
            self.stats_name, self.stats_fn = "naive", functools.partial(attention_stats, return_probs=True)
        self.saved: list = []

    def __enter__(self):
        self.distance, self.entropy, self.max_logit = [], [], []
        self.maps = self.rollout = None
        blocks = list(self.model.blocks)
        self.saved = [b.attn.attn_fn for b in blocks]
        for i, block in enumerate(blocks):
            block.attn.attn_fn = functools.partial(self._attend, i == len(blocks) - 1)
        return self

    def __exit__(self, *exc) -> None:
        for block, fn in zip(self.model.blocks, self.saved):
            block.attn.attn_fn = fn
        self.saved = []
        if self.rollout is not None:
            self.rollout = self._patch_map(self.rollout[:, None])[:, 0]

    def _attend(self, last: bool, qkv: torch.Tensor) -> torch.Tensor:
        """The layer's attention on packed ``(B, N, 3, H, d)`` qkv, recording its statistics."""
        q, k, v = split_qkv(qkv)
        scale = q.shape[-1] ** -0.5
        out, distance, entropy, max_logit, *probs = self.stats_fn(q, k, v, self.grid, self.patch_size, self.prefix,
                                                                   softmax_scale=scale)
        self.distance.append(distance[:, :, self.prefix:].float().mean(-1))
        self.entropy.append(entropy.float().mean(-1))
        self.max_logit.append(max_logit.float().amax(-1))
        if probs:
            self.rollout = rollout_step(self.rollout, probs[0])
        if last and self.want_maps:
            self.maps = self._patch_map(query_attention(q, k, self.prefix or q.shape[2], scale))
        return out

    def _patch_map(self, rows: torch.Tensor) -> torch.Tensor:
        """``(B, H, N)`` attention over all keys -> ``(B, H, grid_h, grid_w)`` over the patches: the class token's
        row when there is one (row 0), else the mean over rows (already averaged by the caller for maps)."""
        if rows.dim() == 4:  # (B, 1, N, N) rollout
            rows = rows[:, :, 0] if self.prefix else rows.mean(2)
        return rows[..., self.prefix:].reshape(*rows.shape[:2], *self.grid)
