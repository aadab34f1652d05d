"""Vision Transformer (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words", eqs. 1-4).

An image (B, C, S, S) is cut into (S/P)² patches of P×P pixels, each projected to embed_dim by a
strided convolution; a class token is prepended and a learned position embedding added, giving
x ∈ R^(B×N×D) with N = (S/P)² + 1. Each of `depth` pre-norm blocks applies multi-head
self-attention then an MLP, each with a residual. The class token's final state feeds a linear head.

`global_pool='avg'` drops the class token (N = (S/P)²) and averages the normed tokens instead, and
`pos_embed='sincos2d'` fixes the position embedding to 2-D sin-cos features: the "Better plain ViT
baselines" model (Beyer et al., 2022, big_vision `pool_type='gap'`, `posemb='sincos2d'`).

Parameter names and layout match timm's `VisionTransformer` (no layer scale, no qk-norm), so a timm
state dict loads with strict=True: `global_pool='token'` is timm's default, `'avg'` is timm's
`global_pool='avg', class_token=False, fc_norm=False`; a sincos2d `pos_embed` is the same parameter,
frozen (requires_grad=False). The model knows nothing of kernels beyond
`kernels.get_attention_qkvpacked(name)`: the backend is a callable from the fused projection's
(B, N, 3, H, d) qkv to a (B, H, N, d) output (the contract in `kernels`).
"""
from __future__ import annotations

import torch
from timm.layers import DropPath, trunc_normal_
from torch import nn

from kernels import get_attention_qkvpacked

# Named sizes: timm's Ti/S/B/L (width, depth, heads). debug (head_dim 32) takes the digits default to 96.9 %
# val top-1 in 30 epochs (~4.5 s of one CPU core per epoch); 96 wide / 3 heads cost 1.5× per epoch and was at
# 94-95 % after 20 epochs (lr 1e-3) where 64 wide was at 96-97 % (lr 2e-3), measured on 2 cores.
SIZES: dict[str, dict[str, int]] = {
    "debug": {"embed_dim": 64, "depth": 4, "num_heads": 2},
    "tiny": {"embed_dim": 192, "depth": 12, "num_heads": 3},
    "small": {"embed_dim": 384, "depth": 12, "num_heads": 6},
    "base": {"embed_dim": 768, "depth": 12, "num_heads": 12},
    "large": {"embed_dim": 1024, "depth": 24, "num_heads": 16},
}


def posemb_sincos_2d(h: int, w: int, dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """(1, h·w, dim) float32 fixed position embedding of an h×w patch grid, row-major: per patch
    [sin(x·ω), cos(x·ω), sin(y·ω), cos(y·ω)] with ω_i = temperature^(-i / (dim/4 - 1)), i < dim/4.
    big_vision's ``posemb_sincos_2d`` (models/vit.py; MoCo v3's), value for value.

    Raises:
        ValueError: ``dim`` is not a multiple of 4.
    """
    if dim % 4:
        raise ValueError(f"pos_embed='sincos2d' needs embed_dim divisible by 4, got {dim}")
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4 - 1))
    x, y = x.flatten()[:, None] * omega, y.flatten()[:, None] * omega  # (h·w, dim/4)
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).float()[None]


def img_hw(img_size) -> tuple[int, int]:
    """``img_size`` as (height, width) pixels: an int is square, ``[H, W]`` (list or tuple) rectangular, as timm's
    ``img_size``. Raises ValueError for anything else."""
    if isinstance(img_size, int) and not isinstance(img_size, bool):
        return img_size, img_size
    hw = tuple(img_size) if not isinstance(img_size, str) and hasattr(img_size, "__len__") else ()
    if len(hw) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in hw):
        raise ValueError(f"img_size={img_size!r}: an integer (square) or [height, width] in pixels")
    return hw


class PatchEmbed(nn.Module):
    """(B, C, H, W) image -> (B, (H/P)·(W/P), D) patch tokens (row-major): a P×P stride-P convolution, computed as
    one matrix product of the flattened patches with the (D, C·P·P) weight (Dosovitskiy et al. 2021, eq. 1: x_p E,
    each patch flattened channel-first, the convolution weight's order).

    ``proj`` stays an ``nn.Conv2d`` so that parameter names and shapes are timm's (hooks on ``proj`` do not fire).
    Why not call it: on the H200 (ViT-B/16, 224 px, batch 256, bf16, compiled; ``benchmarks.profile_step --top 16``,
    2026-12-02) cuDNN ran that convolution in 1.58 ms a step plus 1.30 ms of NCHW-to-NHWC copies, 4 % of the step's
    kernel time, for 0.06 TFLOP of forward work. As one product (2026-12-03, same command) neither kernel is in the
    step, where timm's in the same run still spent 1.47 + 1.26 ms on them (benchmarks/results/h200_20261203.md).
    ``img_size``: an int (square) or (H, W); ``grid`` is (H/P, W/P).

    Raises:
        ValueError: an input that is not 4-D, a channel count other than ``in_chans``, or another image size than
            the model's.
    """

    def __init__(self, img_size, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.img_hw = img_hw(img_size)
        if self.img_hw[0] % patch_size or self.img_hw[1] % patch_size:
            raise ValueError(f"img_size={img_size} is not divisible by patch_size={patch_size}; "
                             f"choose an img_size that is a multiple of {patch_size}")
        self.img_size, self.patch_size = img_size, patch_size
        self.grid = (self.img_hw[0] // patch_size, self.img_hw[1] // patch_size)
        self.num_patches = self.grid[0] * self.grid[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        C, P = self.proj.in_channels, self.patch_size
        if x.ndim != 4:
            raise ValueError(f"input images have shape {tuple(x.shape)}; the model takes a batch (B, {C}, H, W): add "
                             f"the batch dimension (x[None])")
        if x.shape[1] != C:
            fix = ("move channels first (x.permute(0, 3, 1, 2))" if x.shape[-1] == C else
                   "set in_chans to the images' channel count")
            raise ValueError(f"input images have shape {tuple(x.shape)}; the model takes (B, {C}, H, W): {fix}")
        S1, S2 = x.shape[-2:]  # (B, C, S1, S2)
        if (S1, S2) != self.img_hw:
            H, W = self.img_hw
            rebuild = (f"or build the model with img_size={[S1, S2]}" if S1 % P == 0 and S2 % P == 0 else
                       f"or resize the images to multiples of patch_size={P}")
            raise ValueError(f"input images are {S1}×{S2}, the model was built for {H}×{W}; set data.img_size="
                             f"{H if H == W else [H, W]}, {rebuild}")
        B, (gh, gw), D = x.shape[0], self.grid, self.proj.out_channels
        x = x.reshape(B, C, gh, P, gw, P).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * P * P)  # (B, N, C·P·P)
        return nn.functional.linear(x, self.proj.weight.reshape(D, C * P * P), self.proj.bias)  # (B, N, D)


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection; the product itself is the backend's."""

    def __init__(self, embed_dim: int, num_heads: int, attention: str = "naive"):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, embed_dim * 3)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.set_attention(attention)

    def set_attention(self, name: str, **options) -> None:
        self.backend = name
        self.attn_fn = get_attention_qkvpacked(name, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, d)
        x = self.attn_fn(qkv)  # (B, H, N, d)
        x = x.transpose(1, 2).reshape(B, N, D)  # (B, N, D)
        return self.proj(x)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, backend={self.backend!r}"


class Mlp(nn.Module):
    """Linear -> GELU -> Linear, hidden width mlp_ratio × embed_dim."""

    def __init__(self, embed_dim: int, hidden_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)), with drop-path."""

    def __init__(self, embed_dim: int, num_heads: int, mlp_ratio: float, drop_path: float, attention: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.attn = Attention(embed_dim, num_heads, attention)
        self.norm2 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.mlp = Mlp(embed_dim, int(embed_dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    """ViT classifier: (B, in_chans, img_size, img_size) float images -> (B, num_classes) logits.

    Args:
        img_size, patch_size: pixels; img_size must be a multiple of patch_size.
        in_chans: image channels (3 for RGB).
        num_classes: size of the head's output.
        embed_dim, depth, num_heads: width D, number of blocks, heads H (head_dim = D / H).
        mlp_ratio: MLP hidden width over D.
        drop_rate: dropout after the position embedding and before the head.
        drop_path_rate: stochastic depth, linearly increasing over blocks to this value.
        attention: backend name from `kernels.available_backends()`.
        attention_options: that backend's keyword options (e.g. ``{"fp32_delta": True}`` for flash).
        global_pool: 'token' (class token -> head) or 'avg' (no class token; mean of the normed tokens).
        pos_embed: 'learn' (trained, truncated-normal init) or 'sincos2d' (fixed, :func:`posemb_sincos_2d`).

    Raises:
        ValueError: img_size not divisible by patch_size, embed_dim not divisible by num_heads,
            an unknown attention backend, global_pool or pos_embed.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 768, depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0,
                 drop_rate: float = 0.0, drop_path_rate: float = 0.0, attention: str = "naive",
                 global_pool: str = "token", pos_embed: str = "learn", attention_options: dict | None = None):
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool={global_pool!r}: use 'token' (class token) or 'avg' (mean of the tokens)")
        if pos_embed not in ("learn", "sincos2d"):
            raise ValueError(f"pos_embed={pos_embed!r}: use 'learn' or 'sincos2d' (fixed 2-D sin-cos)")
        self.num_classes, self.embed_dim, self.global_pool, self.pos_embed_type = (num_classes, embed_dim,
                                                                                  global_pool, pos_embed)
        self.num_prefix_tokens = 1 if global_pool == "token" else 0
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if self.num_prefix_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + self.num_prefix_tokens, embed_dim),
                                      requires_grad=pos_embed == "learn")
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, dpr[i], attention) for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if attention_options:
            self.set_attention(attention, **attention_options)
        self.init_weights()

    def init_weights(self) -> None:
        if self.pos_embed_type == "learn":
            trunc_normal_(self.pos_embed, std=0.02)
        else:  # the class token's row, if any, stays 0 (big_vision adds the embedding before prepending it)
            with torch.no_grad():
                self.pos_embed[:, self.num_prefix_tokens:] = posemb_sincos_2d(*self.patch_embed.grid, self.embed_dim)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def set_attention(self, name: str, **options) -> None:
        """Swap every block's attention backend, with its options (weights are untouched)."""
        for block in self.blocks:
            block.attn.set_attention(name, **options)

    @property
    def seq_len(self) -> int:
        return self.pos_embed.shape[1]

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups (stem, then each block, then the final norm and head), as timm's
        ``VisionTransformer.group_matcher``; ``timm.optim.param_groups_layer_decay`` reads it."""
        return {"stem": r"^cls_token|pos_embed|patch_embed",
                "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, (S/P)², D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, N, D)
        x = self.pos_drop(x + self.pos_embed)
        x = self.blocks(x)
        return self.norm(x)  # (B, N, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        x = x[:, 0] if self.global_pool == "token" else x.mean(dim=1)  # (B, D): class token or mean of tokens
        return self.head(self.head_drop(x))  # (B, num_classes)


def create_model(size: str, attention: str = "naive", **overrides) -> VisionTransformer:
    """Build a named size (`debug`, `tiny`, `small`, `base`, `large`) with optional overrides.

    Raises:
        ValueError: unknown size; the message lists the valid ones.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; valid sizes are: {', '.join(SIZES)} (set it with model=<size>)")
    return VisionTransformer(**{**SIZES[size], **overrides}, attention=attention)
