"""vit/prepare.py on a tiny generated folder: layout and class names kept, sizes bounded, resume, bad files."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from vit.images import load_rgb, open_split
from vit.prepare import prepare, target_size

ROOT = Path(__file__).resolve().parents[1]
MAX_SIDE = 24


def image(path: Path, w: int, h: int, seed: int, fmt: str = "JPEG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    a = np.clip(rng.uniform(40, 200, 3) + 50 * np.stack([x, y, x * y], -1), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))


@pytest.fixture
def folder(tmp_path):
    """train/{cat,dog,empty}, val/{cat,dog,empty}: large and small JPEGs, a large PNG, a nested one, a bad file."""
    src = tmp_path / "src"
    for split in ("train", "val"):
        image(src / split / "cat" / "big.JPEG", 60, 40, 1)  # resized to 36x24
        image(src / split / "cat" / "tall.jpg", 30, 90, 2)  # resized to 24x72
        image(src / split / "dog" / "small.jpg", 20, 16, 3)  # copied as is
        image(src / split / "dog" / "big.png", 50, 50, 4, "PNG")  # resized, written as big.png.jpg
        image(src / split / "dog" / "sub" / "nested.jpg", 48, 32, 5)
        (src / split / "empty").mkdir()
    (src / "train" / "cat" / "broken.jpg").write_bytes((src / "train" / "cat" / "big.JPEG").read_bytes()[:300])
    (src / "train" / "cat" / "notes.txt").write_text("not an image")
    image(src / "train" / ".hidden" / "x.jpg", 40, 40, 6)
    return src, tmp_path / "out"


def run(src, out, *extra):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="prepare", overrides=[f"data.root={src}", f"out={out}", f"max_side={MAX_SIDE}",
                                                        "num_workers=0", *extra])
    return prepare(cfg)


def outputs(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(out)): Image.open(p).size for p in sorted(out.rglob("*")) if p.is_file()
            and p.name != "prepare_bad_files.txt"}


def test_target_size_bounds_the_shorter_side():
    assert target_size(500, 375, 256) == (341, 256)
    assert target_size(375, 500, 256) == (256, 341)
    assert target_size(300, 256, 256) is None and target_size(1000, 100, 256) is None  # shorter side within


def test_layout_sizes_and_bad_file(folder):
    src, out = folder
    result = run(src, out)
    assert (result["resized"], result["copied"], result["done"], result["bad"]) == (8, 2, 0, 1)
    assert list(result["bad_files"]) == [str(src / "train/cat/broken.jpg")]
    assert "broken.jpg" in (out / "prepare_bad_files.txt").read_text()
    sizes = outputs(out)
    for split in ("train", "val"):
        assert sizes[f"{split}/cat/big.JPEG"] == (36, 24) and sizes[f"{split}/cat/tall.jpg"] == (24, 72)
        assert sizes[f"{split}/dog/small.jpg"] == (20, 16)
        assert sizes[f"{split}/dog/big.png.jpg"] == (24, 24)
        assert Image.open(out / split / "dog" / "big.png.jpg").format == "JPEG"
        assert sizes[f"{split}/dog/sub/nested.jpg"] == (36, 24)
        assert (out / split / "dog" / "small.jpg").read_bytes() == (src / split / "dog" / "small.jpg").read_bytes()
        assert (out / split / "empty").is_dir()
    assert len(sizes) == 10 and all(min(s) <= MAX_SIDE for s in sizes.values())
    for split in ("train", "val"):  # the loader sees the same classes (the empty one removed from both)
        for d in (src, out):
            (d / split / "empty").rmdir()
        assert open_split(out, split).classes == open_split(src, split).classes == ["cat", "dog"]
    resized = np.asarray(load_rgb(str(out / "val/cat/big.JPEG")), np.float32)
    reference = np.asarray(load_rgb(str(src / "val/cat/big.JPEG")).resize((36, 24), Image.LANCZOS), np.float32)
    assert np.abs(resized - reference).mean() < 3  # the same picture, JPEG-compressed once more


def test_resume_skips_finished_files_and_repairs_a_killed_run(folder, monkeypatch):
    src, out = folder
    real_save, calls = Image.Image.save, []

    def dies_on_third_save(self, fp, *args, **kwargs):
        calls.append(fp)
        if len(calls) == 3:
            Path(fp).write_bytes(b"\xff\xd8 half a file")
            raise KeyboardInterrupt  # as a kill would stop it, mid-write
        return real_save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", dies_on_third_save)
    with pytest.raises(KeyboardInterrupt):
        run(src, out)
    monkeypatch.setattr(Image.Image, "save", real_save)
    finished = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()
                and not p.name.endswith(".part")}
    assert len(finished) == 2  # two resized files made it; the third is only a .part
    for p in finished:
        load_rgb(str(p))  # whole
    result = run(src, out)
    assert (result["done"], result["resized"] + result["copied"], result["bad"]) == (2, 8, 1)
    assert all((p.stat().st_ino, p.stat().st_mtime_ns) == stamp for p, stamp in finished.items())  # not redone
    assert not list(out.rglob("*.part"))
    assert len(outputs(out)) == 10
    for p in out.rglob("*.jp*g"):
        load_rgb(str(p))
    again = run(src, out)
    assert (again["done"], again["resized"], again["copied"]) == (10, 0, 0)


def test_command_line_with_worker_processes(folder):
    src, out = folder
    proc = subprocess.run([sys.executable, "-m", "vit.prepare", f"data.root={src}", f"out={out}", "max_side=24",
                           "num_workers=2", f"hydra.run.dir={out.parent / 'log'}"], check=False, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resized 8, copied 2, already there 0, bad 1" in proc.stdout
    assert len(outputs(out)) == 10
    assert (out.parent / "log" / "prepare.log").exists()


@pytest.mark.parametrize("extra,match", [(["max_side=null"], "max_side is required"), (["max_side=0"], "positive"),
                                         (["quality=100"], "1..95"), (["num_workers=-1"], "num_workers")])
def test_bad_arguments(folder, extra, match):
    with pytest.raises(ValueError, match=match):
        run(*folder, *extra)


def test_out_inside_root_and_missing_root(folder):
    src, _ = folder
    with pytest.raises(ValueError, match="inside it"):
        run(src, src / "small")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run(src.parent / "missing", src.parent / "out")


def test_readme_prepare_and_gpu_decode_lines_compose():
    """The README's vit.prepare and data.decode=gpu lines name keys that exist (composed, not run)."""
    import shlex

    lines = [line.split("#")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()
             if line.startswith(("python -m vit.prepare", "python train.py")) and ("vit.prepare" in line
                                                                                 or "data.decode" in line)]
    assert len(lines) == 2
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        prep = compose(config_name="prepare", overrides=shlex.split(lines[0])[3:])
        run = compose(config_name="train", overrides=shlex.split(lines[1])[2:])
    assert prep.max_side == 320 and prep.out == "/data/imagenet_320" and run.data.decode == "gpu"
