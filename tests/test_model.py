"""Our ViT against timm's, position-embedding resize on load, and clear errors for wrong weights."""
from __future__ import annotations

import pytest
import timm
import torch

from vit.checkpoint import load_model_weights
from vit.model import SIZES, PatchEmbed, create_model


def test_rectangular_img_size_matches_timm_and_resizes_a_square_pos_embed():
    """img_size=[H, W] as timm's tuple: same patch grid and logits as timm's ViT at (32, 64); a square 8×8
    pos_embed (32 px, patch 4) loads into a [48, 32] model resampled to the 12×8 grid."""
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(32, 64), num_classes=5).eval()
    ours = create_model("tiny", attention="naive", img_size=[32, 64], patch_size=16, num_classes=5).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 64)
    with torch.no_grad():
        assert (ours(x) - ref(x)).abs().max().item() <= 1e-5
    assert ours.patch_embed.grid == (2, 4) and ours.seq_len == 9
    with pytest.raises(ValueError, match=r"input images are 64×32, the model was built for 32×64"):
        ours(x.transpose(2, 3))
    square = create_model("debug", img_size=32, patch_size=4, num_classes=3).state_dict()
    rect = create_model("debug", img_size=[48, 32], patch_size=4, num_classes=3)
    load_model_weights(rect, square, source="square.pt")
    assert rect.pos_embed.shape == (1, 12 * 8 + 1, 64)
    assert torch.equal(rect.pos_embed[:, 0], square["pos_embed"][:, 0])  # the class token's row is kept


@pytest.mark.parametrize("img_size, patch_size, in_chans", [(224, 16, 3), ([48, 80], 16, 3), (36, 4, 1)])
def test_patch_embed_is_its_convolution(img_size, patch_size, in_chans):
    """The patch embedding (flattened patches times the reshaped weight) against the stride-P convolution it stands
    for, in float64 on random images and weights: tokens, and the weight, bias and image gradients."""
    torch.manual_seed(0)
    pe = PatchEmbed(img_size, patch_size, in_chans, 48).double()
    torch.nn.init.normal_(pe.proj.bias)
    hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    x = torch.randn(3, in_chans, *hw, dtype=torch.float64, requires_grad=True)
    ours, ref = pe(x), pe.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)
    assert ours.shape == (3, pe.num_patches, 48)
    assert (ours - ref).abs().max().item() <= 1e-12
    g = torch.randn_like(ref)
    grads = [torch.autograd.grad(y, (x, pe.proj.weight, pe.proj.bias), g) for y in (ours, ref)]
    for a, b in zip(*grads):
        assert (a - b).abs().max().item() <= 1e-11
    with pytest.raises(ValueError, match=rf"takes \(B, {in_chans}, H, W\): set in_chans"):
        pe(torch.randn(3, in_chans + 1, *hw, dtype=torch.float64))
    for shape in ((in_chans, *hw), hw[:1]):  # no batch; 1-D
        with pytest.raises(ValueError, match=r"takes a batch .*add the batch dimension"):
            pe(torch.randn(*shape, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"move channels first \(x.permute\(0, 3, 1, 2\)\)"):
        pe(torch.randn(3, *hw, in_chans, dtype=torch.float64))  # (B, H, W, C)
    with pytest.raises(ValueError, match=rf"resize the images to multiples of patch_size={patch_size}"):
        pe(torch.randn(1, in_chans, hw[0] + 1, hw[1], dtype=torch.float64))


def test_timm_state_dict_loads_strict_and_logits_match():
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    ours = create_model("tiny", attention="naive", img_size=224, patch_size=16, num_classes=1000).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        diff = (ours(x) - ref(x)).abs().max().item()
    assert diff <= 1e-5, f"logits differ from timm's by {diff:.2e}"
    ours.set_attention("sdpa")
    with torch.no_grad():
        assert (ours(x) - ref(x)).abs().max().item() <= 1e-5


def test_pos_embed_resized_when_image_size_differs():
    """A 32 px checkpoint loads into a 48 px model: the 8×8 grid is resampled to 12×12 (bicubic)."""
    src = create_model("debug", img_size=32, patch_size=4, num_classes=10)
    dst = create_model("debug", img_size=48, patch_size=4, num_classes=10)
    load_model_weights(dst, src.state_dict())
    assert dst.pos_embed.shape == (1, 145, SIZES["debug"]["embed_dim"])
    assert torch.equal(dst.pos_embed[:, 0], src.pos_embed[:, 0])  # class token's embedding untouched
    assert torch.equal(dst.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)
    grid = src.pos_embed[0, 1:].reshape(8, 8, -1).permute(2, 0, 1)[None]  # (1, D, 8, 8)
    expected = torch.nn.functional.interpolate(grid, size=(12, 12), mode="bicubic", antialias=True,
                                               align_corners=False)[0].permute(1, 2, 0).reshape(144, -1)
    assert torch.allclose(dst.pos_embed[0, 1:], expected, atol=1e-6)
    dst(torch.randn(1, 3, 48, 48))


def test_other_model_size_names_the_mismatch():
    small = create_model("small", img_size=32, patch_size=16, num_classes=10)
    tiny = create_model("tiny", img_size=32, patch_size=16, num_classes=10)
    with pytest.raises(RuntimeError, match=r"shape mismatches.*model size.*blocks\.0\."):
        load_model_weights(tiny, small.state_dict())
    deeper = create_model("debug", img_size=32, patch_size=4, num_classes=10, depth=5)
    with pytest.raises(RuntimeError, match=r"unexpected keys \(\d+\): blocks\.4\."):
        load_model_weights(create_model("debug", img_size=32, patch_size=4, num_classes=10), deeper.state_dict())


def test_unknown_size_and_backend_raise():
    with pytest.raises(ValueError, match="valid sizes are: debug, tiny"):
        create_model("huge")
    with pytest.raises(ValueError, match="valid backends are"):
        create_model("debug", attention="nope")


def test_backends_give_same_logits_and_grads():
    torch.manual_seed(0)
    model = create_model("debug", img_size=32, patch_size=4, num_classes=10)
    x = torch.randn(4, 3, 32, 32)
    outs = []
    for name in ("naive", "sdpa"):
        model.set_attention(name)
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        outs.append((out.detach(), model.blocks[0].attn.qkv.weight.grad.clone()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-4, rtol=1e-4)


def test_global_avg_pool_and_sincos2d_match_timm_and_big_vision():
    """global_pool=avg + pos_embed=sincos2d: timm's avg-pooled ViT without class token loads our state dict
    strictly and gives the same logits; the fixed embedding is big_vision's posemb_sincos_2d formula."""
    import math

    from vit.model import posemb_sincos_2d

    torch.manual_seed(0)
    ours = create_model("small", img_size=64, patch_size=16, num_classes=10, global_pool="avg",
                        pos_embed="sincos2d").eval()
    ref = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=64, num_classes=10,
                            global_pool="avg", class_token=False, fc_norm=False).eval()
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (ours(x) - ref(x)).abs().max().item() <= 1e-5
    assert "cls_token" not in ours.state_dict() and ours.seq_len == 16 and not ours.pos_embed.requires_grad
    pe = posemb_sincos_2d(4, 4, 384)[0]  # patch (row 2, col 3), feature i of each quarter
    omega = [10_000 ** (-i / 95) for i in (0, 50, 95)]
    for i, w in zip((0, 50, 95), omega):
        assert pe[2 * 4 + 3, i].item() == pytest.approx(math.sin(3 * w), abs=1e-6)  # sin(x·ω)
        assert pe[2 * 4 + 3, 96 + i].item() == pytest.approx(math.cos(3 * w), abs=1e-6)  # cos(x·ω)
        assert pe[2 * 4 + 3, 192 + i].item() == pytest.approx(math.sin(2 * w), abs=1e-6)  # sin(y·ω)
        assert pe[2 * 4 + 3, 288 + i].item() == pytest.approx(math.cos(2 * w), abs=1e-6)  # cos(y·ω)
    assert torch.equal(ours.pos_embed, posemb_sincos_2d(4, 4, 384))
    bigger = create_model("small", img_size=96, patch_size=16, num_classes=10, global_pool="avg", pos_embed="sincos2d")
    load_model_weights(bigger, ours.state_dict())  # another grid: the fixed embedding is recomputed, not resampled
    assert torch.equal(bigger.pos_embed, posemb_sincos_2d(6, 6, 384))
    assert torch.equal(bigger.blocks[1].mlp.fc2.weight, ours.blocks[1].mlp.fc2.weight)


def test_learned_pos_embed_without_class_token_resizes_the_whole_grid():
    src = create_model("debug", img_size=32, patch_size=4, num_classes=10, global_pool="avg")
    dst = create_model("debug", img_size=48, patch_size=4, num_classes=10, global_pool="avg")
    load_model_weights(dst, src.state_dict())
    assert dst.pos_embed.shape == (1, 144, SIZES["debug"]["embed_dim"])
    assert torch.allclose(dst.pos_embed[0, 0], src.pos_embed[0, 0], atol=0.02)  # corner stays near the corner
