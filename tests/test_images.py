"""vit/images.py on small real files made here with PIL: decoding to RGB, bad files, layout errors."""
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from vit.images import (
    BadImageWarning,
    RobustImageFolder,
    check_same_classes,
    collate_drop_bad,
    load_rgb,
    open_split,
)


def smooth_rgb(seed: int, h: int = 20, w: int = 24) -> np.ndarray:
    """(h, w, 3) uint8: a random colour gradient plus noise (JPEG keeps it within a few levels)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = rng.uniform(40, 200, 3) + 50 * np.stack([x, y, x * y], -1) + rng.normal(0, 3, (h, w, 3))
    return np.clip(base, 0, 255).astype(np.uint8)


def write_good(path: Path, seed: int) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = smooth_rgb(seed)
    Image.fromarray(a).save(path, format="JPEG", quality=95)
    return a


def write_bad(folder: Path) -> dict[str, Path]:
    """A truncated JPEG, a text file named .jpg and a zero-byte file; the keys are words of the reason."""
    folder.mkdir(parents=True, exist_ok=True)
    write_good(folder / "b_trunc.jpg", 99)
    data = (folder / "b_trunc.jpg").read_bytes()
    (folder / "b_trunc.jpg").write_bytes(data[: len(data) // 2])
    (folder / "d_text.jpg").write_text("this is not an image\n")
    (folder / "f_empty.jpg").write_bytes(b"")
    return {"truncated": folder / "b_trunc.jpg", "cannot identify": folder / "d_text.jpg",
            "0 bytes": folder / "f_empty.jpg"}


@pytest.fixture
def bad_split(tmp_path):
    """train/ with classes cat (good a, c, e, g + three bad interleaved) and dog (five good): 12 files, 3 bad."""
    for name, seed in [("a", 1), ("c", 2), ("e", 3), ("g", 4)]:
        write_good(tmp_path / "train" / "cat" / f"{name}_good.jpg", seed)
    for i in range(5):
        write_good(tmp_path / "train" / "dog" / f"{i}.jpg", 10 + i)
    return tmp_path, write_bad(tmp_path / "train" / "cat")


def bad_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, BadImageWarning)]


def test_every_decodable_kind_becomes_rgb(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    rgb = smooth_rgb(0)
    Image.fromarray(rgb).convert("CMYK").save(d / "cmyk.jpg", quality=95)
    assert Image.open(d / "cmyk.jpg").mode == "CMYK"
    assert np.abs(np.asarray(load_rgb(str(d / "cmyk.jpg")), np.int16) - rgb).mean() < 6

    Image.fromarray(rgb).save(d / "png.JPEG", format="PNG")
    assert np.array_equal(np.asarray(load_rgb(str(d / "png.JPEG"))), rgb)

    g16 = np.random.default_rng(1).integers(0, 65536, (20, 24), dtype=np.uint16)
    g16[0, :3] = [32768, 65535, 0]
    Image.fromarray(g16).save(d / "gray16.png")
    assert Image.open(d / "gray16.png").mode.startswith("I")
    out = np.asarray(load_rgb(str(d / "gray16.png")))  # (H, W, 3)
    assert out[0, :3, 0].tolist() == [128, 255, 0] and (out == out[..., :1]).all()
    assert np.abs(out[..., 0].astype(np.float64) - g16 / 257.0).max() <= 0.5

    rgba = np.concatenate([rgb, np.full((20, 24, 1), 255, np.uint8)], -1)
    rgba[0, 0], rgba[0, 1] = (10, 20, 30, 0), (10, 20, 30, 128)
    Image.fromarray(rgba, "RGBA").save(d / "rgba.png")
    out = np.asarray(load_rgb(str(d / "rgba.png")))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert np.abs(out[0, 1].astype(int) - [132, 137, 142]).max() <= 1  # 10·128/255 + 255·127/255
    assert np.array_equal(out[1:], rgb[1:])
    assert load_rgb(str(d / "rgba.png"), background=(0, 0, 0)).getpixel((0, 0)) == (0, 0, 0)

    pal = Image.fromarray(rgb).quantize(16)
    pal.save(d / "pal.png", transparency=int(np.asarray(pal)[0, 0]))
    out = np.asarray(load_rgb(str(d / "pal.png")))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert np.array_equal(out[np.asarray(pal) != np.asarray(pal)[0, 0]],
                          np.asarray(pal.convert("RGB"))[np.asarray(pal) != np.asarray(pal)[0, 0]])

    Image.fromarray(rgb[..., 0]).save(d / "gray.jpg")
    out = np.asarray(load_rgb(str(d / "gray.jpg")))
    assert out.shape == (20, 24, 3) and (out == out[..., :1]).all()

    ds = RobustImageFolder(tmp_path, create_transform(16, is_training=True))
    assert len(ds) == 6 and ds.num_bad == 0
    for img, target in ds:
        assert img.shape == (3, 16, 16) and img.dtype == torch.float32 and target == 0


def test_bad_files_warn_once_are_counted_and_replaced(bad_split):
    root, bad = bad_split
    ds = open_split(root, "train", max_bad_fraction=0.5)
    assert len(ds) == 12 and ds.num_bad == 0  # lazy: nothing opened yet
    paths = [p for p, _ in ds.samples]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        epochs = [[(np.asarray(img), t) for img, t in ds] for _ in range(2)]
    messages = bad_warnings(record)
    assert len(messages) == 3
    for reason, path in bad.items():
        assert sum(str(path) in m for m in messages) == 1
        assert reason in next(m for m in messages if str(path) in m).lower()
        assert reason in ds.bad_reasons[str(path)].lower()
    assert ds.num_bad == 3 and ds.bad_files == sorted(str(p) for p in bad.values())
    for epoch in epochs:  # a bad index yields the next good one, in both epochs
        for path in bad.values():
            i = paths.index(str(path))
            assert np.array_equal(epoch[i][0], epoch[i + 1][0]) and epoch[i][1] == epoch[i + 1][1]
        assert all(img.ndim == 3 and img.shape[2] == 3 for img, _ in epoch)


def test_replacement_of_the_last_sample_wraps_to_the_first(tmp_path):
    write_good(tmp_path / "cat" / "a.jpg", 0)
    write_good(tmp_path / "cat" / "b.jpg", 1)
    (tmp_path / "cat" / "z.jpg").write_bytes(b"")
    ds = RobustImageFolder(tmp_path, max_bad_fraction=0.5)
    with pytest.warns(BadImageWarning, match="z.jpg"):
        assert np.array_equal(np.asarray(ds[-1][0]), np.asarray(ds[0][0]))
    assert ds.num_bad == 1 and np.array_equal(np.asarray(ds[2][0]), np.asarray(ds[0][0]))
    with pytest.raises(IndexError):
        ds[3]


def test_too_many_bad_files_stop_with_counts(bad_split):
    root, _ = bad_split
    ds = open_split(root, "train", max_bad_fraction=0.1)  # 12 files: one bad is allowed, the second is not
    with pytest.warns(BadImageWarning), pytest.raises(RuntimeError, match=r"2 of 12 .*max_bad_fraction=0.1"):
        for _ in ds:
            pass
    with pytest.raises(ValueError, match="max_bad_fraction"):
        RobustImageFolder(root / "train", max_bad_fraction=1.5)


def test_verify_counts_up_front_and_drops(bad_split):
    root, bad = bad_split
    with pytest.warns(BadImageWarning) as record:
        ds = open_split(root, "train", max_bad_fraction=0.3, verify=True)
    assert len(bad_warnings(record)) == 3
    assert ds.num_bad == 3 and len(ds) == 9 and ds.num_files == 12
    assert ds.bad_files == sorted(str(p) for p in bad.values())
    assert ds.targets.count(0) == 4 and ds.targets.count(1) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(np.asarray(img).shape[2] == 3 for img, _ in ds)
    with pytest.warns(BadImageWarning), pytest.raises(RuntimeError, match="(?s)3 of 12 .*Examples:.*b_trunc.jpg"):
        open_split(root, "train", max_bad_fraction=0.2, verify=True)


WORKER_SCRIPT = """
import sys, torch
from vit.images import open_split
ds = open_split(sys.argv[1], "train", lambda im: torch.as_tensor(list(im.size)), max_bad_fraction=0.5)
loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)
for epoch in range(2):
    assert sum(len(y) for _, y in loader) == 12
print("num_bad", ds.num_bad)
"""


def test_bad_files_counted_across_workers_and_warn_once(bad_split):
    root, bad = bad_split
    run = subprocess.run([sys.executable, "-c", WORKER_SCRIPT, str(root)], capture_output=True, text=True,
                         check=False, timeout=120, cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr
    assert "num_bad 3" in run.stdout
    for path in bad.values():  # new workers each epoch see the shared record and stay quiet
        assert run.stderr.count(f"skipping bad image {path}") == 1, run.stderr


def test_layout_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere.*root/train/<class>"):
        open_split(tmp_path / "nowhere", "train")
    write_good(tmp_path / "train" / "cat" / "a.jpg", 0)
    with pytest.raises(FileNotFoundError, match=r"val does not exist.*\['train'\]"):
        open_split(tmp_path, "val")
    (tmp_path / "val").mkdir()
    with pytest.raises(ValueError, match=r"no class folders in .*val"):
        open_split(tmp_path, "val")
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()  # hidden: not a class
    (tmp_path / "train" / "dog").mkdir()
    (tmp_path / "train" / "dog" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"1 class folder.*train/dog"):
        open_split(tmp_path, "train")
    write_bad(tmp_path / "train" / "dog")
    assert open_split(tmp_path, "train", max_bad_fraction=1.0).classes == ["cat", "dog"]
    with pytest.warns(BadImageWarning), pytest.raises(ValueError, match=r"no decodable image.*train/dog"):
        open_split(tmp_path, "train", max_bad_fraction=1.0, verify=True)


def test_class_mismatch_lists_both_sides(tmp_path):
    for split, classes in [("train", ["cat", "dog", "emu"]), ("val", ["cat", "dog", "fox"])]:
        for i, c in enumerate(classes):
            write_good(tmp_path / split / c / "x.jpg", i)
    train, val = open_split(tmp_path, "train"), open_split(tmp_path, "val")
    with pytest.raises(ValueError, match=r"only in train: \['emu'\], only in val: \['fox'\]"):
        check_same_classes(train, val)
    check_same_classes(train, open_split(tmp_path, "train"))


def test_evaluation_split_drops_bad_files_instead_of_repeating_a_neighbour(tmp_path):
    """In validation a bad file must not be replaced by the next image: that would count it twice."""
    root = tmp_path / "val"
    good = []
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            path = root / cls / f"{i}.png"
            Image.fromarray(np.full((8, 8, 3), 40 * i + (100 if cls == "b" else 0), np.uint8)).save(path)
            good.append(path)
    (root / "a" / "9_bad.jpg").write_bytes(b"not an image")
    ds = RobustImageFolder(root, transform=lambda im: torch.from_numpy(np.asarray(im)).permute(2, 0, 1),
                           max_bad_fraction=0.5, substitute_bad=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, shuffle=False, collate_fn=collate_drop_bad)
    with pytest.warns(BadImageWarning, match="9_bad.jpg"):
        batches = [b for b in loader]
    seen = [b for b in batches if b is not None]
    assert sum(x.shape[0] for x, _ in seen) == len(good)  # 6 good images, each once; the bad one dropped
    labels = torch.cat([y for _, y in seen]).tolist()
    assert sorted(labels) == [0, 0, 0, 1, 1, 1]
    assert collate_drop_bad([None, None]) is None


def test_framework_substitutes_only_in_training(tmp_path):
    from vit.data import build_imagefolder

    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8) + 7).save(tmp_path / split / "a" / "0.png")
    assert build_imagefolder(tmp_path, "train", None).substitute_bad is True
    assert build_imagefolder(tmp_path, "val", None).substitute_bad is False


def test_randaugment_runs_every_op_at_full_magnitude():
    """timm's RandAugment ('inc1' ops, as `data.auto_augment=rand-m9-mstd0.5-inc1`) reaches magnitude 10,
    where PosterizeIncreasing keeps 0 bits; Pillow 13 raises on that inside a DataLoader worker,
    hence pyproject's pillow<13. Every op is forced to run at magnitude 10 on a real RGB image."""
    from timm.data.auto_augment import rand_augment_transform

    augment = rand_augment_transform("rand-m10-mstd0-inc1", {"img_mean": (124, 116, 104)})
    img = Image.fromarray(smooth_rgb(0, 32, 32))
    names = []
    for op in augment.ops:
        op.prob = 1.0
        out = op(img)
        assert out.size == img.size and out.mode == "RGB", op.name
        names.append(op.name)
    assert "PosterizeIncreasing" in names


def test_too_many_bad_files_in_a_worker_stop_the_run_with_one_clean_error(tmp_path):
    """One text file named .jpg among 20 images (5 % > 1 %), read by a DataLoader worker: train() raises the
    bad-file error itself, not torch's re-raise carrying the worker's traceback as text."""
    from hydra import compose, initialize_config_dir

    from train import train
    from vit.images import TooManyBadFilesError

    for split in ("train", "val"):
        for i in range(10):
            for cls in ("cat", "dog"):
                write_good(tmp_path / "ds" / split / cls / f"{i}.jpg", i)
    (tmp_path / "ds" / "train" / "cat" / "5.jpg").write_text("this is not an image\n")
    with initialize_config_dir(config_dir=str(Path(__file__).parents[1] / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "data=imagefolder", f"data.root={tmp_path / 'ds'}", "data.img_size=16", "data.num_workers=1",
            "batch_size=4", "epochs=3", "model=debug", "attention=naive", "logger=none", "progress=false",
            f"out_dir={tmp_path / 'out'}"])
    with pytest.raises(TooManyBadFilesError) as error:  # the bad file warns in the worker, on its stderr
        train(cfg)
    message = str(error.value)
    assert message.startswith(f"1 of 20 image files under {tmp_path / 'ds' / 'train'} are bad (5.00%)")
    assert "5.jpg: UnidentifiedImageError: cannot identify image file" in message
    assert "DataLoader worker" not in message and "Traceback" not in message
    assert error.value.__cause__ is None and error.value.__suppress_context__


BOMB_SCRIPT = """
import sys, torch
from PIL import Image
from vit.images import open_split
Image.MAX_IMAGE_PIXELS = 300  # the 20×24 test images (480 px) warn; twice that would be an error
ds = open_split(sys.argv[1], "train", lambda im: torch.as_tensor(list(im.size)), max_bad_fraction=0.0)
loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)
for epoch in range(2):
    assert sum(len(y) for _, y in loader) == 8
"""


def test_decompression_bomb_warning_shows_once_per_run(tmp_path):
    """8 images over PIL's pixel limit, 2 workers, 2 epochs (4 worker processes): one warning in all."""
    for i in range(8):
        write_good(tmp_path / "train" / ("cat" if i % 2 else "dog") / f"{i}.jpg", i)
    run = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         check=False, timeout=120, cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("DecompressionBombWarning") == 1, run.stderr
    assert "could be decompression bomb DOS attack" in run.stderr and "Shown once for" in run.stderr
