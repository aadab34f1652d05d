"""vit/gpu_decode.py (data.decode=gpu): the bytes dataset, bad-file and CPU-decode accounting, the augmentation
draws (timm's, for the same seed), and the batch step, on CPU with torchvision's CPU decoder; on a GPU (marked
gpu) the same steps with nvJPEG against PIL."""
import json
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
import torchvision.transforms.v2.functional as F2
from omegaconf import OmegaConf
from PIL import Image

import vit.gpu_decode as gd
from vit.color_jitter import color_jitter
from vit.crop_resize import crop_resize
from vit.data import ResumableSampler, SeededDataset, build_imagefolder, build_pipeline, build_transform
from vit.images import BadImageWarning, TooManyBadFilesError, load_rgb

CONFIG = OmegaConf.load("configs/data/imagefolder.yaml")
ON_GPU = torch.cuda.is_available()


def smooth(seed: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    return np.clip(rng.uniform(40, 200, 3) + 60 * np.stack([x, y, x * y], -1) + rng.normal(0, 4, (h, w, 3)),
                   0, 255).astype(np.uint8)


@pytest.fixture
def folder(tmp_path):
    """train/a: 0-4 JPEGs (1: grayscale, 3: CMYK), 5 PNG, 6 truncated JPEG, 7 empty; train/b: 0-5 JPEGs, two of
    them carrying a JPEG comment that the tests' patched decoders react to."""
    root = tmp_path / "ds"
    for c, count in (("a", 5), ("b", 6)):
        (root / "train" / c).mkdir(parents=True)
        for i in range(count):
            img = Image.fromarray(smooth(10 * (c == "b") + i, 30 + 3 * i, 44 - 2 * i))
            img = img.convert("L") if (c, i) == ("a", 1) else img.convert("CMYK") if (c, i) == ("a", 3) else img
            comment = {("b", 2): b"GPU-FAILS", ("b", 4): b"ALL-FAIL"}.get((c, i), b"")
            img.save(root / "train" / c / f"{i}.jpg", quality=92, comment=comment)
    Image.fromarray(smooth(5, 26, 34)).save(root / "train" / "a" / "5.png")
    whole = (root / "train" / "a" / "0.jpg").read_bytes()
    (root / "train" / "a" / "6.jpg").write_bytes(whole[: len(whole) // 2])
    (root / "train" / "a" / "7.jpg").write_bytes(b"")
    return root


def make(root, img_size=24, jitter=0.4, max_bad=0.5):
    cfg = OmegaConf.merge(CONFIG, {"img_size": img_size, "train_aug": {"color_jitter": jitter}})
    transform = build_transform(cfg, True)
    folder = build_imagefolder(root, "train", transform, max_bad_fraction=max_bad)
    aug = gd.gpu_augment(transform)
    seeded = SeededDataset(gd.BytesFolder(folder, aug))
    decoder = gd.GpuDecoder(seeded.dataset, aug, lambda i, s: seeded[(i, s)])
    return cfg, folder, seeded, decoder


@pytest.fixture
def patched(monkeypatch):
    """decode_jpeg fails on files with a GPU-FAILS or ALL-FAIL comment (a batch holding one fails whole, as the
    real decoders do); PIL fails on ALL-FAIL: the decoder's repair paths, on CPU."""
    real_decode, real_pixels = gd.decode_jpeg, gd.pil_pixels

    def decode(data, **kwargs):
        for d in data if isinstance(data, list) else [data]:
            if b"FAIL" in d.numpy().tobytes():
                raise RuntimeError("decode_jpeg: corrupt data")
        return real_decode(data, **kwargs)

    def pixels(data):
        if b"ALL-FAIL" in data:
            raise OSError("broken data stream")
        return real_pixels(data)

    monkeypatch.setattr(gd, "decode_jpeg", decode)
    monkeypatch.setattr(gd, "pil_pixels", pixels)


def test_sample_params_are_timms_draws(folder):
    """Same seed: timm's whole train transform on a PIL image = our draws applied with torchvision's PIL ops."""
    cfg = OmegaConf.merge(CONFIG, {"img_size": 20})
    transform = build_transform(cfg, True)
    aug = gd.gpu_augment(transform)
    img = Image.fromarray(smooth(0, 37, 51))
    flips, boxes = 0, set()
    for seed in range(40):
        random.seed(seed)
        torch.manual_seed(seed)
        expected = transform(img)  # uint8 (3, 20, 20)
        random.seed(seed)
        torch.manual_seed(seed)
        box, flip, order, factors = gd.sample_params(img.size, aug)
        out = TF.resized_crop(img, *box, [20, 20], aug.crop.interpolation)
        out = TF.hflip(out) if flip else out
        ops = {0: TF.adjust_brightness, 1: TF.adjust_contrast, 2: TF.adjust_saturation}
        for op in order:
            out = ops[op](out, factors[op]) if op in ops else out
        assert torch.equal(torch.from_numpy(np.array(out)).permute(2, 0, 1), expected), seed
        flips, boxes = flips + flip, boxes | {tuple(box)}
        top, left, h, w = box
        assert 0 <= top and top + h <= 37 and 0 <= left and left + w <= 51
    assert 5 < flips < 35 and len(boxes) > 30  # both flips, and mostly a new box per seed
    random.seed(3)
    torch.manual_seed(3)
    again = gd.sample_params(img.size, aug)
    random.seed(3)
    torch.manual_seed(3)
    assert gd.sample_params(img.size, aug) == again


def test_gpu_augment_refuses_what_it_cannot_run():
    cfg = OmegaConf.merge(CONFIG, {"train_aug": {"auto_augment": "rand-m9-mstd0.5-inc1"}})
    with pytest.raises(ValueError, match="auto_augment=null"):
        gd.gpu_augment(build_transform(cfg, True))
    assert gd.gpu_augment(build_transform(CONFIG, True)).jitters
    assert not gd.gpu_augment(build_transform(OmegaConf.merge(CONFIG, {"train_aug": {"color_jitter": 0}}), True)).jitters


def test_bytes_dataset_items_and_bad_files(folder):
    _, images, seeded, _ = make(folder)
    paths = [p for p, _ in images.samples]
    names = [p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p in paths]
    kinds = {}
    with pytest.warns(BadImageWarning) as record:
        items = [seeded[(i, 7)] for i in range(len(paths))]
    for payload, meta, _, _, label, seed in items:
        kinds[names[int(meta[8])]] = int(meta[0])
        assert label == images.samples[int(meta[8])][1] and seed == 7
        if meta[0] == gd.JPEG_KIND:
            assert payload.numpy().tobytes() == Path(paths[int(meta[8])]).read_bytes()
        else:
            pixels = np.asarray(load_rgb(paths[int(meta[8])]))
            assert np.array_equal(payload.view(*pixels.shape).numpy(), pixels)
            assert meta[1:3].tolist() == list(pixels.shape[:2])
    warned = {str(w.message).split(":")[0].rsplit("/", 1)[-1] for w in record if w.category is BadImageWarning}
    assert warned == {"6.jpg", "7.jpg"}
    assert images.num_bad == seeded.dataset.num_bad == 2  # the truncated and the empty file
    assert {n for n, k in kinds.items() if k == gd.PIXELS_KIND} == {"a/3.jpg", "a/5.png"}  # CMYK, PNG
    assert kinds["a/1.jpg"] == gd.JPEG_KIND  # grayscale JPEGs go to the GPU
    assert seeded.dataset.num_cpu_decoded == 2  # CMYK, PNG (the truncated one is bad, not decoded)
    assert "a/6.jpg" not in kinds and "a/7.jpg" not in kinds  # replaced by the next good file
    assert names[int(seeded[(paths.index(str(folder / "train/a/6.jpg")), 7)][1][8])] == "b/0.jpg"


def test_batch_step_matches_the_cpu_transform(folder):
    """The batch step's uint8 crops = timm's CPU transform of the same samples (torchvision's CPU decoder and
    resize here; GPU tolerance in the gpu test below)."""
    for jitter in (0.0, 0.4):
        _, images, seeded, decoder = make(folder, img_size=24, jitter=jitter)
        cpu = SeededDataset(images)
        items = [(i, 100 + i) for i in (0, 1, 2, 3, 4, 5, 8, 9)]  # the good files of class a, and b/0, b/1
        x, y, seeds = decoder(gd.collate_bytes([seeded[it] for it in items]), "cpu")
        assert x.dtype == torch.uint8 and x.shape == (8, 3, 24, 24) and seeds.tolist() == [s for _, s in items]
        reference = torch.stack([cpu[it][0] for it in items])
        assert y.tolist() == [cpu[it][1] for it in items]
        assert (x.int() - reference.int()).abs().float().mean() < 0.1


def v2_gpu_arithmetic(img, box, size, mode):
    """torchvision v2 ``resized_crop`` as it runs on a CUDA uint8 image: float32 resize, clamp (bicubic), round."""
    out = F2.resized_crop(img.float(), *box, size, mode, antialias=True)
    out = out.clamp(0, 255) if mode == TF.InterpolationMode.BICUBIC else out
    return out.round().to(torch.uint8)


def assert_close_to_v2(out, images, boxes, flips, size, mode, reference=v2_gpu_arithmetic):
    """out[b] against ``reference`` (v2's GPU arithmetic) for image b, flipped where asked: at most one level apart,
    and rarely (a float32 sum sitting at .5 may round either way)."""
    for b, (img, box) in enumerate(zip(images, boxes)):
        ref = reference(img, box, size, mode)
        ref = ref.flip(-1) if flips[b] else ref
        diff = (out[b].int() - ref.int()).abs()
        assert diff.max() <= 1 and diff.float().mean() <= 0.01, (mode, b, diff.max().item(), diff.float().mean().item())


def test_crop_resize_is_v2s_gpu_arithmetic():
    """vit.crop_resize (one launch for the batch; here under Triton's interpreter) = v2 ``resized_crop``'s GPU
    arithmetic per image, flipped where asked, for boxes smaller, larger and of the output's size; a box of the
    output's size is the crop itself, exactly. On CPU tensors resized_crops is v2's own (uint8 natively)."""
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in ((37, 51), (20, 16), (9, 30))]
    boxes, flips = [[3, 5, 30, 40], [2, 1, 12, 12], [0, 0, 9, 30]], [False, True, True]
    for mode in (TF.InterpolationMode.BILINEAR, TF.InterpolationMode.BICUBIC):
        out = crop_resize(images, boxes, flips, [12, 12], bicubic=mode == TF.InterpolationMode.BICUBIC)
        assert out.dtype == torch.uint8 and out.shape == (3, 3, 12, 12)
        assert_close_to_v2(out, images, boxes, flips, [12, 12], mode)
        assert torch.equal(out[1], images[1][:, 2:14, 1:13].flip(-1))
        cpu = gd.resized_crops(images, boxes, flips, [12, 12], mode)
        assert torch.equal(cpu[2], F2.resized_crop(images[2], *boxes[2], [12, 12], mode, antialias=True).flip(-1))


def test_crop_resize_refuses_what_it_cannot_crop():
    img = torch.zeros(3, 8, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="not inside"):
        crop_resize([img], [[4, 0, 5, 8]], [False], [4, 4], bicubic=True)
    with pytest.raises(ValueError, match="uint8 \\(3, h, w\\)"):
        crop_resize([img.float()], [[0, 0, 8, 8]], [False], [4, 4], bicubic=True)
    with pytest.raises(ValueError, match="as many images, boxes and flips"):
        crop_resize([img], [], [False], [4, 4], bicubic=True)


def test_color_jitter_is_pils(folder):
    img = Image.fromarray(smooth(3, 21, 17))
    x = torch.from_numpy(np.asarray(img)).permute(2, 0, 1)[None].repeat(3, 1, 1, 1)
    order = torch.tensor([[0, 1, 2, 3], [2, 3, 1, 0], [1, 0, 3, 2]])
    factors = torch.tensor([[0.6, 1.4, 0.9], [1.3, 0.7, 1.1], [1.0, 0.65, 1.35]])
    out = gd.jitter_ops(x, order, factors)
    assert torch.equal(color_jitter(x, order, factors), out)
    ops = {0: TF.adjust_brightness, 1: TF.adjust_contrast, 2: TF.adjust_saturation}
    for b in range(3):
        ref = img
        for op in order[b].tolist():
            ref = ops[op](ref, float(factors[b, op])) if op in ops else ref
        ref = torch.from_numpy(np.array(ref)).permute(2, 0, 1)
        assert torch.equal(out[b], ref), b  # PIL's own arithmetic: float32 blends, no fused multiply-adds


def jitter_op_by_op(x, order, factors):
    """The colour jitter written plainly, every op blended for the whole batch and kept where it applies."""
    x, f = x.float(), factors.view(-1, 3, 1, 1, 1)
    for position in range(4):
        for op in range(3):
            applies = (order[:, position] == op).view(-1, 1, 1, 1)
            base = (torch.zeros_like(x[:, :1]) if op == 0 else
                    gd.gray_mean(gd.gray(x)) if op == 1 else gd.gray(x))
            x = torch.where(applies, gd._floor_blend(x, base, f[:, op]), x)
    return x.to(torch.uint8)


def test_color_jitter_is_the_op_by_op_jitter_bitwise():
    """One blend per position (each image's own base and factor) = every op blended and selected, bitwise, for
    random orders (hue's position included), factors and pixels; also where no image needs the grayscale."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 9, 11), dtype=torch.uint8, generator=g)
    order = torch.stack([torch.randperm(4, generator=g) for _ in range(16)])
    factors = 0.6 + 0.8 * torch.rand(16, 3, generator=g)
    assert torch.equal(gd.jitter_ops(x, order, factors), jitter_op_by_op(x, order, factors))
    only_brightness = torch.tensor([[0, 3, 3, 3]] * 16)
    assert torch.equal(gd.jitter_ops(x, only_brightness, factors), jitter_op_by_op(x, only_brightness, factors))


def test_contrast_mean_is_pils_rounding():
    """PIL's ``int(mean + 0.5)``: a mean of exactly k + ½ rounds up, one a hair below it rounds down."""
    half = torch.tensor([100.0, 101.0]).repeat(8).view(1, 1, 4, 4)  # mean 100.5
    below = half.clone()
    below[0, 0, 0, 1] = 100.0  # mean 100.4375
    assert gd.gray_mean(half).item() == 101 and gd.gray_mean(below).item() == 100


def test_one_launch_jitter_is_the_pytorch_jitter_bitwise():
    """vit.color_jitter (under Triton's interpreter here) = gpu_decode.jitter_ops, bitwise: random orders, factors
    and pixels at a size that leaves a partial last block (38 × 41 = 1558 pixels), a contrast factor of 1 (no mean
    pass), and contrast first on a grayscale mean of exactly 100.5 (PIL rounds it up) and one a pixel below it."""
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (6, 3, 38, 41), dtype=torch.uint8, generator=g)
    x[4] = torch.tensor([100, 101], dtype=torch.uint8).repeat(3, 38 * 41 // 2).view(3, 38, 41)  # gray = the value
    x[5] = x[4]
    x[5, :, 0, 1] = 100
    assert [gd.gray_mean(gd.gray(x[i:i + 1].float())).item() for i in (4, 5)] == [101, 100]
    order = torch.stack([torch.randperm(4, generator=g) for _ in range(6)])
    order[4:] = torch.tensor([1, 0, 2, 3])
    factors = 0.6 + 0.8 * torch.rand(6, 3, generator=g)
    factors[2, 1] = 1.0
    out = color_jitter(x, order, factors)
    assert torch.equal(out, gd.jitter_ops(x, order, factors))
    assert (out != x).any(dim=(1, 2, 3)).all()


def test_one_launch_jitter_refuses_bad_shapes():
    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="uint8 \\(B, 3, H, W\\)"):
        color_jitter(x.float(), torch.zeros(2, 4, dtype=torch.int64), torch.ones(2, 3))
    with pytest.raises(ValueError, match="order \\(B, 4\\) and factors \\(B, 3\\)"):
        color_jitter(x, torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3))


def test_decoder_failures_fall_back_to_pil_or_count_a_bad_file(folder, patched):
    _, images, seeded, decoder = make(folder)
    paths = [p for p, _ in images.samples]
    gpu_fails, all_fail = paths.index(str(folder / "train/b/2.jpg")), paths.index(str(folder / "train/b/4.jpg"))
    items = [(0, 11), (gpu_fails, 12), (all_fail, 13), (8, 14)]
    batch = gd.collate_bytes([seeded[it] for it in items])
    before = seeded.dataset.num_cpu_decoded
    with pytest.warns(BadImageWarning, match="b/4.jpg: OSError: broken data stream"):
        x, y, _ = decoder(batch, "cpu")
    assert x.shape == (4, 3, 24, 24) and images.num_bad == 1 and seeded.dataset.num_cpu_decoded == before + 1
    # the bad file's item is the next good file under the same seed: what the workers give from now on
    replacement = seeded[(all_fail, 13)]
    assert int(replacement[1][8]) == all_fail + 1
    again, y2, _ = decoder(gd.collate_bytes([seeded[it] for it in items]), "cpu")
    assert torch.equal(x, again) and torch.equal(y, y2)
    assert seeded[(gpu_fails, 12)][1][0] == gd.PIXELS_KIND  # read with PIL from now on


def test_loader_thread_on_cpu_and_too_many_bad_files(folder):
    cfg, images, _, _ = make(folder)
    sampler = ResumableSampler(len(images), shuffle=True, seed=0)
    pipe = build_pipeline(cfg, is_training=True)
    transform = build_transform(cfg, True)
    runs = []
    for workers in (0, 2):
        loader, _ = gd.gpu_train_loader(images, transform, pipe.on_device, "cpu", 4, sampler, workers, seed=0)
        batches = list(loader)
        assert len(batches) == len(loader) == 3 and all(x.shape == (4, 3, 24, 24) and x.dtype == torch.float32
                                                         for x, _ in batches)
        runs.append(torch.cat([x for x, _ in batches]))
    assert torch.equal(runs[0], runs[1])  # workers or not, the same batches
    strict = build_imagefolder(folder, "train", transform, max_bad_fraction=0.05)  # 2 of 14 bad is too many
    loader, _ = gd.gpu_train_loader(strict, transform, pipe.on_device, "cpu", 4, sampler, 0, seed=0)
    with pytest.raises(TooManyBadFilesError, match="data.max_bad_fraction=0.05"):
        list(loader)  # raised in the thread, re-raised here
    # from a worker it arrives as a RuntimeError holding the worker's traceback (as text): the plain error instead
    # (not run through worker processes here: torch then takes 10 s to shut down the failed loader's workers)
    plain = loader._plain_error(RuntimeError("Caught TooManyBadFilesError in DataLoader worker process 0 ..."))
    assert isinstance(plain, TooManyBadFilesError) and "data.max_bad_fraction=0.05" in str(plain)
    other = RuntimeError("something else")
    assert gd.GpuDecodeLoader._plain_error(gd.gpu_train_loader(images, transform, pipe.on_device, "cpu", 4, sampler,
                                                                0, seed=0)[0], other) is other


def test_loader_stops_its_thread_when_left_early(folder):
    cfg, images, _, _ = make(folder)
    sampler = ResumableSampler(len(images), shuffle=True, seed=0)
    loader, _ = gd.gpu_train_loader(images, build_transform(cfg, True), build_pipeline(cfg, True).on_device, "cpu",
                                    2, sampler, 0, seed=0)
    it = iter(loader)
    next(it)
    it.close()
    assert not any(t.name == "gpu-decode" for t in threading.enumerate())


def test_loader_started_early_decodes_ahead_and_gives_the_same_batches(folder):
    """start() (Data.start_epoch's, before validation) decodes the first ``depth`` batches before iter() is called;
    the iteration then gives the batches an unstarted loader gives."""
    cfg, images, _, _ = make(folder)
    pipe, transform = build_pipeline(cfg, is_training=True), build_transform(cfg, True)
    runs = []
    for early in (True, False):
        sampler = ResumableSampler(len(images), shuffle=True, seed=0)
        sampler.set_epoch(1)
        loader, _ = gd.gpu_train_loader(images, transform, pipe.on_device, "cpu", 4, sampler, 0, seed=0)
        if early:
            loader.start()
            ready = loader._started[0]
            deadline = time.monotonic() + 30
            while not ready.full() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ready.qsize() == loader.depth, "the started loader decoded nothing ahead"
        runs.append(list(loader))
        assert loader._started is None
    assert len(runs[0]) == len(runs[1]) == 3
    for (x, y), (x2, y2) in zip(*runs, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_a_second_start_or_a_cancel_stops_the_begun_thread(folder):
    cfg, images, _, _ = make(folder)
    sampler = ResumableSampler(len(images), shuffle=True, seed=0)
    loader, _ = gd.gpu_train_loader(images, build_transform(cfg, True), build_pipeline(cfg, True).on_device, "cpu",
                                    4, sampler, 0, seed=0)
    loader.start()
    first = loader._started[2]
    loader.start()
    assert not first.is_alive() and loader._started[2].is_alive()
    loader.cancel()
    assert loader._started is None and not any(t.name == "gpu-decode" for t in threading.enumerate())
    assert len(list(loader)) == 3  # a cancelled start leaves the loader as new
    it = iter(loader)
    next(it)  # an iteration being taken, as train_epoch's when training raises: cancel() ends its thread too
    loader.cancel()
    assert loader._live is None and not any(t.name == "gpu-decode" for t in threading.enumerate())
    assert len(list(loader)) == 3


def test_gpu_decode_needs_loader_workers():
    from test_train import compose_cfg

    from vit.data import check_decode

    cfg = compose_cfg("train", ["data=imagefolder", "data.decode=gpu", "data.num_workers=0"]).data
    with pytest.raises(ValueError, match="data.decode=gpu needs loader workers"):
        check_decode(cfg, "cuda")
    assert check_decode(OmegaConf.merge(cfg, {"num_workers": 2}), "cuda") == "gpu"


@pytest.mark.gpu
def test_gpu_decode_matches_pil(folder):
    _, images, _, _ = make(folder)
    compared = 0
    for path, _ in images.samples:
        try:  # the folder's empty and truncated files are no image: route raises, as the workers expect
            where = gd.route(Path(path).read_bytes())[0]
        except gd.DECODE_ERRORS:
            continue
        if where != "gpu":
            continue
        data = Path(path).read_bytes()
        gpu = gd.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=gd.ImageReadMode.RGB,
                             device="cuda")
        pil = torch.from_numpy(np.asarray(load_rgb(path))).permute(2, 0, 1)
        assert gpu.is_cuda and gpu.shape == pil.shape
        assert (gpu.cpu().int() - pil.int()).abs().float().mean() < 2, path
        compared += 1
    assert compared >= 5, f"only {compared} files were decoded on the GPU"


@pytest.mark.gpu
def test_gpu_resized_crops_are_v2_resized_crop():
    """On CUDA, the batch's one launch against v2's own ``resized_crop`` there, up to float rounding; a box that
    leaves its image takes v2's path (which pads), bitwise."""
    g = torch.Generator().manual_seed(1)
    sizes = ((375, 500), (64, 48), (1200, 1600), (333, 500))
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g).cuda() for h, w in sizes]
    boxes, flips = [[10, 20, 300, 260], [0, 0, 64, 48], [100, 50, 1000, 1400], [0, 7, 200, 150]], [False, True, True, False]
    for mode in (TF.InterpolationMode.BILINEAR, TF.InterpolationMode.BICUBIC):
        out = gd.resized_crops(images, boxes, flips, [224, 224], mode)
        assert_close_to_v2(out, images, boxes, flips, [224, 224], mode,
                           reference=lambda img, box, size, m: F2.resized_crop(img, *box, size, m, antialias=True))
    outside = [[-4, 30, 100, 90], [0, 0, 64, 48], [0, 0, 10, 10], [0, 0, 10, 10]]  # v2 pads a box outside the image
    out = gd.resized_crops(images, outside, [False] * 4, [224, 224], TF.InterpolationMode.BICUBIC)
    assert torch.equal(out[0], F2.resized_crop(images[0], *outside[0], [224, 224], TF.InterpolationMode.BICUBIC))


@pytest.mark.gpu
def test_gpu_color_jitter_is_the_op_by_op_jitter_bitwise():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (32, 3, 64, 48), dtype=torch.uint8, generator=g)
    order = torch.stack([torch.randperm(4, generator=g) for _ in range(32)])
    factors = 0.6 + 0.8 * torch.rand(32, 3, generator=g)
    out = gd.jitter(x.cuda(), order, factors)
    assert out.is_cuda and torch.equal(out, jitter_op_by_op(x.cuda(), order.cuda(), factors.cuda()))


@pytest.mark.gpu
def test_gpu_batch_step_and_loader(folder):
    cfg, images, seeded, decoder = make(folder, img_size=32)
    items = [(i, 100 + i) for i in (0, 1, 2, 3, 4, 5, 8, 9)]
    cuda, _, _ = decoder(gd.collate_bytes([seeded[it] for it in items]), "cuda")
    cpu, _, _ = decoder(gd.collate_bytes([seeded[it] for it in items]), "cpu")
    assert cuda.is_cuda and cuda.dtype == torch.uint8 and cuda.shape == (8, 3, 32, 32)
    assert (cuda.cpu().int() - cpu.int()).abs().float().mean() < 2  # nvJPEG and float resize vs libjpeg and uint8
    sampler = ResumableSampler(len(images), shuffle=True, seed=0)
    loader, seeded = gd.gpu_train_loader(images, build_transform(cfg, True), build_pipeline(cfg, True).on_device,
                                         "cuda", 4, sampler, 2, seed=0)
    batches = list(loader)  # the workers warn on their stderr
    assert len(batches) == 3 and all(x.is_cuda and x.dtype == torch.float32 and x.shape == (4, 3, 32, 32) and
                                     y.is_cuda for x, y in batches)
    assert seeded.dataset.num_bad == 2 and seeded.dataset.num_cpu_decoded == 2


@pytest.mark.gpu
def test_gpu_decoder_failures_on_the_gpu(folder, patched):
    """The repair paths with nvJPEG decoding the rest of the batch: PIL's decode for one, a bad file replaced."""
    _, images, seeded, decoder = make(folder)
    paths = [p for p, _ in images.samples]
    gpu_fails, all_fail = paths.index(str(folder / "train/b/2.jpg")), paths.index(str(folder / "train/b/4.jpg"))
    items = [(0, 11), (gpu_fails, 12), (all_fail, 13), (8, 14)]
    with pytest.warns(BadImageWarning, match="b/4.jpg"):
        x, _, _ = decoder(gd.collate_bytes([seeded[it] for it in items]), "cuda")
    assert x.is_cuda and x.shape == (4, 3, 24, 24) and images.num_bad == 1 and seeded.dataset.num_cpu_decoded == 1
    cpu, _, _ = decoder(gd.collate_bytes([seeded[it] for it in items]), "cpu")
    assert (x.cpu().int() - cpu.int()).abs().float().mean() < 2


def test_build_data_decode_option(folder):
    from test_train import compose_cfg

    from vit.data import build_data

    (folder / "val").mkdir()
    for c in ("a", "b"):
        (folder / "val" / c).mkdir()
        Image.fromarray(smooth(50, 30, 30)).save(folder / "val" / c / "0.jpg")
    cfg = compose_cfg("train", ["data=imagefolder", f"data.root={folder}", "data.img_size=24", "data.num_workers=0",
                                "data.max_bad_fraction=0.5", "data.decode=gpu"]).data
    with pytest.raises(ValueError, match="data.decode=gpu decodes JPEGs on a CUDA GPU, but this run's device is cpu"):
        build_data(cfg, 4, 4, "cpu", 0)
    with pytest.raises(ValueError, match="data.decode='nvjpeg' is not one of cpu"):
        build_data(OmegaConf.merge(cfg, {"decode": "nvjpeg"}), 4, 4, "cpu", 0)
    data = build_data(OmegaConf.merge(cfg, {"decode": "cpu"}), 4, 4, "cpu", 0)
    assert not isinstance(data.train_loader, gd.GpuDecodeLoader)


@pytest.mark.gpu
def test_train_with_gpu_decode(folder, tmp_path):
    from test_train import compose_cfg

    from train import train

    (folder / "val").mkdir()
    for c in ("a", "b"):
        (folder / "val" / c).mkdir()
        Image.fromarray(smooth(50, 30, 30)).save(folder / "val" / c / "0.jpg")
    run = train(compose_cfg("train", ["data=imagefolder", f"data.root={folder}", "data.img_size=32",
                                      "data.num_workers=2", "data.max_bad_fraction=0.5", "data.decode=gpu",
                                      "batch_size=4", "epochs=2", "logger=none", "progress=false", "attention=sdpa",
                                      f"out_dir={tmp_path / 'run'}"]))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["data/bad_files"] for r in records if "data/bad_files" in r] == [2, 2]
    assert all(np.isfinite(r["train/loss"]) for r in records if "train/loss" in r) and run is not None
