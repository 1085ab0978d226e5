"""The preprocess stage end to end on a private local Ray: Parquet contents, skipping,
reuse, atomic replacement, the real Food-101 sample and the entry points' exit status."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.support.cli import REPO_ROOT
from tests.support.ray_instances import driver_env_joining_this_ray
from tests.support.shared_data import FOOD101_SAMPLE as SAMPLE
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from tests.support.images import (
    jpeg_bytes,
    make_food101_tree,
    make_hf_shards,
    make_imagefolder_tree,
    nearest_class,
    food101_image_path,
    write_text_as_jpeg,
    write_truncated_jpeg,
)
from jobs.errors import ExitCode
from workloads.vision.config import DataConfig
from workloads.vision.errors import DataSourceError
from workloads.vision.images import square_jpeg_from_bytes
from workloads.vision.preprocess import stage as preprocess
from workloads.vision.preprocess import writing as dataset_format
from workloads.vision.preprocess.stage import run_preprocess
from workloads.vision.reading.manifest import MANIFEST_NAME, load_dataset_info


EXPECTED_SCHEMA = pa.schema(
    [("image", pa.binary()), ("label", pa.int64()), ("class_name", pa.string()), ("split", pa.string()), ("path", pa.string())]
)


@pytest.fixture(scope="module")
def ray_local(workload_ray):
    yield


def read_split(root: Path, split: str) -> list[dict]:
    rows = []
    for part in sorted((root / split).glob("part-*.parquet")):
        rows.extend(pq.read_table(part).to_pylist())
    return rows


def mean_rgb(jpeg: bytes) -> tuple[float, float, float]:
    pixels = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.float64)
    return tuple(pixels.reshape(-1, 3).mean(axis=0))


def test_square_jpeg_resizes_shorter_side_and_crops_centre():
    wide = Image.new("RGB", (300, 100), (0, 0, 255))
    wide.paste((255, 0, 0), (100, 0, 200, 100))  # red centre third, blue sides
    out = io.BytesIO()
    wide.save(out, format="JPEG", quality=95)
    result = Image.open(io.BytesIO(square_jpeg_from_bytes(out.getvalue(), 32, 90)))
    assert result.size == (32, 32) and result.mode == "RGB" and result.format == "JPEG"
    r, g, b = mean_rgb(square_jpeg_from_bytes(out.getvalue(), 32, 90))
    assert r > 200 and b < 60  # only the centre square survives

    rgba = Image.new("RGBA", (40, 60), (0, 0, 0, 0))
    png = io.BytesIO()
    rgba.save(png, format="PNG")
    assert min(mean_rgb(square_jpeg_from_bytes(png.getvalue(), 16, 90))) > 240  # transparency → white


def test_food101_end_to_end_schema_rows_and_labels(ray_local, tmp_path):
    counts = {"pizza": (11, 3), "sushi": (7, 2), "fried_rice": (6, 4)}
    root = make_food101_tree(tmp_path / "src", counts)
    out = tmp_path / "out"
    data = DataConfig(
        source="food101", root=root.parent, classes=["sushi", "fried rice", "pizza"], image_size=24,
        rows_per_file=5, output_dir=out,
    )
    info = run_preprocess(data, progress=False)
    assert info.root == out and info.classes == ["sushi", "fried rice", "pizza"] and not info.reused
    assert info.counts == {"train": 24, "val": 9} and info.image_size == 24 and info.skipped == {}

    for split, expected in (("train", {"sushi": 7, "fried rice": 6, "pizza": 11}), ("val", {"sushi": 2, "fried rice": 4, "pizza": 3})):
        parts = sorted((out / split).glob("part-*.parquet"))
        sizes = []
        for part in parts:
            meta = pq.ParquetFile(part)
            assert meta.schema_arrow == EXPECTED_SCHEMA
            sizes.extend(meta.metadata.row_group(i).num_rows for i in range(meta.num_row_groups))
        assert all(n == 5 for n in sizes[:-1]) and 0 < sizes[-1] <= 5
        rows = read_split(out, split)
        assert Counter(r["class_name"] for r in rows) == expected
        folders = ["sushi", "fried_rice", "pizza"]
        for row in rows:
            assert row["split"] == split
            assert info.classes[row["label"]] == row["class_name"]
            image = Image.open(io.BytesIO(row["image"]))
            assert image.format == "JPEG" and image.mode == "RGB" and image.size == (24, 24)
            # The pixels still belong to the labelled class.
            assert nearest_class(mean_rgb(row["image"]), folders) == folders[row["label"]]
            assert Path(row["path"]).parent.name == folders[row["label"]]
        # Shuffled: row groups mix classes instead of running class by class.
        assert len({r["label"] for r in rows[:5]}) > 1

    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["counts"] == {"train": 24, "val": 9}
    assert manifest["source"] == {"type": "food101", "root": str(root)}
    assert len(manifest["fingerprint"]) == 64
    assert load_dataset_info(out) == info
    assert not list(tmp_path.glob(".out.*"))  # no build leftovers


@pytest.mark.parametrize("nodes", [1, 2], ids=["workers-read-files", "driver-ships-bytes"])
def test_corrupt_and_non_image_files_are_skipped_and_counted(ray_local, tmp_path, monkeypatch, nodes):
    # With more than one node the driver sends file bytes instead of paths.
    monkeypatch.setattr(preprocess.ray, "nodes", lambda: [{"Alive": True}] * nodes)
    root = make_food101_tree(tmp_path / "src", {"pizza": (6, 2), "steak": (5, 2)})
    write_truncated_jpeg(food101_image_path(root, "pizza", "train", 0))
    write_text_as_jpeg(food101_image_path(root, "steak", "test", 1))
    food101_image_path(root, "steak", "train", 2).unlink()
    info = run_preprocess(
        DataConfig(source="food101", root=root, classes=["pizza", "steak"], image_size=16, output_dir=tmp_path / "out"),
        progress=False,
    )
    assert info.skipped == {"corrupt": 1, "not_an_image": 1, "missing": 1}
    assert info.counts == {"train": 9, "val": 3}
    assert len(read_split(tmp_path / "out", "train")) == 9


def test_imagefolder_end_to_end_with_png_and_bad_files(ray_local, tmp_path):
    root = make_imagefolder_tree(tmp_path / "imgs", {"hot_dog": 10, "ramen": 5}, extensions=(".jpg", ".png", ".jpeg"))
    write_text_as_jpeg(root / "ramen" / "broken.jpg")
    info = run_preprocess(
        DataConfig(source="imagefolder", root=root, classes=["hot dog", "ramen"], image_size=16, val_fraction=0.2,
                   output_dir=tmp_path / "out"),
        progress=False,
    )
    assert info.classes == ["hot dog", "ramen"]
    assert info.counts["train"] + info.counts["val"] == 15 and info.skipped == {"not_an_image": 1}
    rows = read_split(tmp_path / "out", "train") + read_split(tmp_path / "out", "val")
    assert Counter(r["class_name"] for r in rows) == {"hot dog": 10, "ramen": 5}
    assert any(r["path"].endswith(".png") for r in rows)
    for row in rows:
        assert nearest_class(mean_rgb(row["image"]), ["hot_dog", "ramen"]) == ["hot_dog", "ramen"][row["label"]]


def test_hf_parquet_end_to_end(ray_local, tmp_path):
    base = make_hf_shards(
        tmp_path / "hf", {"pizza": (6, 2), "sushi": (5, 3), "ramen": (2, 2)}, rows_per_group=3,
        extra_rows={"train": [(b"definitely not an image", 76)]},  # 76 = pizza
    )
    info = run_preprocess(
        DataConfig(source="hf_parquet", root=base, classes=["pizza", "sushi"], image_size=16, rows_per_file=4,
                   output_dir=tmp_path / "out"),
        progress=False,
    )
    assert info.counts == {"train": 11, "val": 5} and info.skipped == {"not_an_image": 1}
    rows = read_split(tmp_path / "out", "train")
    assert Counter(r["class_name"] for r in rows) == {"pizza": 6, "sushi": 5}
    for row in rows:
        assert nearest_class(mean_rgb(row["image"]), ["pizza", "sushi"]) == ["pizza", "sushi"][row["label"]]
        assert row["path"].startswith("data/train-")


def test_rerun_is_reused_and_force_or_changed_input_redoes(ray_local, tmp_path, capsys):
    root = make_food101_tree(tmp_path / "src", {"pizza": (3, 1), "sushi": (3, 1)})
    data = DataConfig(source="food101", root=root, classes=["pizza", "sushi"], image_size=16, output_dir=tmp_path / "out")
    first = run_preprocess(data, progress=False)
    part = tmp_path / "out" / "train" / "part-00000.parquet"
    stamp = part.stat().st_mtime_ns
    capsys.readouterr()

    second = run_preprocess(data, progress=False)
    assert second.reused and second.counts == first.counts and second.classes == first.classes
    assert part.stat().st_mtime_ns == stamp
    assert "reusing" in capsys.readouterr().out

    assert not run_preprocess(data.model_copy(update={"force": True}), progress=False).reused
    assert not run_preprocess(data.model_copy(update={"image_size": 20}), progress=False).reused

    again = data.model_copy(update={"image_size": 20})
    assert run_preprocess(again, progress=False).reused
    source_file = food101_image_path(root, "sushi")
    source_file.write_bytes(jpeg_bytes((1, 2, 3), seed=5))  # new content, new size/mtime
    assert not run_preprocess(again, progress=False).reused

    # A damaged dataset (part file gone) is rebuilt even with the same fingerprint.
    part.unlink()
    assert not run_preprocess(again, progress=False).reused
    assert part.exists()


def test_failure_mid_write_leaves_previous_dataset_intact(ray_local, tmp_path, monkeypatch):
    root = make_food101_tree(tmp_path / "src", {"pizza": (8, 2), "sushi": (8, 2)})
    out = tmp_path / "out"
    data = DataConfig(source="food101", root=root, classes=["pizza", "sushi"], image_size=16, rows_per_file=4, output_dir=out)
    before = run_preprocess(data, progress=False)
    rows_before = read_split(out, "train") + read_split(out, "val")

    real_write = dataset_format.write_part
    calls = []

    def write_then_fail(path, table, *args):
        if calls:
            raise OSError("disk full (simulated)")
        calls.append(path)
        real_write(path, table, *args)

    monkeypatch.setattr(dataset_format, "write_part", write_then_fail)
    with pytest.raises(OSError, match="simulated"):
        run_preprocess(data.model_copy(update={"force": True, "image_size": 20}), progress=False)
    assert len(calls) == 1  # it failed after writing one file of the new dataset

    assert load_dataset_info(out) == before
    assert read_split(out, "train") + read_split(out, "val") == rows_before
    assert all(Image.open(io.BytesIO(r["image"])).size == (16, 16) for r in rows_before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # the half-built copy is gone


def test_preprocess_killed_mid_write_leaves_the_old_dataset_whole_and_the_next_run_tidies_up(ray_local, tmp_path):
    out = tmp_path / "out"
    classes = ["a", "b", "c", "d"]
    old = DataConfig(source="synthetic", classes=classes, synthetic_per_class=4, image_size=16, output_dir=out)
    before = run_preprocess(old, progress=False)
    rows_before = read_split(out, "train") + read_split(out, "val")

    # A bigger dataset in place of it, written by a driver process of its own (joining this Ray, as a
    # job's driver joins its cluster), SIGKILLed once it has written some parts: a crash, not an exception.
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"data": {"source": "synthetic", "classes": classes, "synthetic_per_class": 600,
                                           "image_size": 32, "rows_per_file": 8, "output_dir": str(out),
                                           "force": True}}))
    writer = subprocess.Popen([sys.executable, "-m", "workloads.vision.preprocess", "--params", str(params)],
                              env=driver_env_joining_this_ray(), cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        def parts_written() -> bool:
            return writer.poll() is not None or any(len(list(building.glob("*/part-*.parquet"))) >= 3
                                                    for building in tmp_path.glob(".out.tmp-*"))

        wait_for_condition(parts_written, timeout_s=HANG_GUARD_S, interval_s=0.02)
        writer.kill()
        _, stderr = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == -signal.SIGKILL, f"it ended before it was killed:\n{stderr[-2000:]}"
    assert [p.name for p in tmp_path.glob(".out.tmp-*")], "the killed run left no half-built folder"

    # Whole or absent, never half: here the kill came before the swap, so the old dataset is untouched.
    assert load_dataset_info(out) == before
    assert read_split(out, "train") + read_split(out, "val") == rows_before
    # The next run of the stage sweeps away what the killed one left.
    run_preprocess(old.model_copy(update={"force": True}), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "params.json"]


def test_refuses_to_replace_a_folder_that_is_not_a_dataset(ray_local, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    data = DataConfig(source="synthetic", classes=["a", "b"], synthetic_per_class=4, image_size=16, output_dir=out)
    with pytest.raises(DataSourceError, match="refusing"):
        run_preprocess(data, progress=False)
    assert (out / "thesis.tex").read_text() == "do not delete"


def test_load_dataset_info_without_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(DataSourceError, match="preprocess"):
        load_dataset_info(tmp_path / "nothing-here")


def _run_with_a_missing_data_root(tmp_path: Path, module: str, env: dict[str, str]) -> None:
    missing = tmp_path / "no-such-folder"
    params = tmp_path / "params.yaml"
    params.write_text(f"stages: [preprocess]\ndata:\n  source: imagefolder\n  root: {missing}\n"
                      f"  output_dir: {tmp_path / 'out'}\n")
    done = subprocess.run([sys.executable, "-m", module, "--params", str(params)], capture_output=True, text=True,
                          timeout=180, env=env, cwd=REPO_ROOT)
    assert done.returncode == ExitCode.BAD_INPUT == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and str(missing) in error_lines[0] and "data.root" in error_lines[0]


def test_a_bad_data_root_exits_2_from_the_preprocess_entry_point(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAYJOBS_WORKLOAD")}
    env.update(PYTHONPATH=str(REPO_ROOT), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    _run_with_a_missing_data_root(tmp_path, "workloads.vision.preprocess", env)


def test_synthetic_is_deterministic_and_classes_differ(ray_local, tmp_path):
    data = DataConfig(source="synthetic", classes=["a", "b", "c", "d"], synthetic_per_class=12, image_size=32,
                      output_dir=tmp_path / "one")
    info = run_preprocess(data, progress=False)
    assert info.counts == {"train": 40, "val": 8}  # round(12 * 0.2) = 2 per class held out
    run_preprocess(data.model_copy(update={"output_dir": tmp_path / "two"}), progress=False)
    one, two = read_split(tmp_path / "one", "train"), read_split(tmp_path / "two", "train")
    assert [r["image"] for r in one] == [r["image"] for r in two]
    assert len({r["image"] for r in one}) == len(one)
    assert all(Image.open(io.BytesIO(r["image"])).size == (32, 32) for r in one)


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"real Food-101 sample not present at {SAMPLE} (kept outside the repo)")
def test_real_food101_sample_end_to_end(ray_local, tmp_path):
    classes = ["pizza", "hamburger", "sushi", "ramen", "steak", "burrito"]
    info = run_preprocess(
        DataConfig(source="food101", root=SAMPLE, classes=classes, image_size=64, rows_per_file=32, output_dir=tmp_path / "out"),
        progress=False,
    )
    assert info.counts == {"train": 72, "val": 24} and info.skipped == {}
    rows = read_split(tmp_path / "out", "val")
    assert Counter(r["class_name"] for r in rows) == {"pizza": 5, "hamburger": 2, "sushi": 5, "ramen": 2, "steak": 5, "burrito": 5}
    assert all(Image.open(io.BytesIO(r["image"])).size == (64, 64) for r in rows)
    assert all("/images/" in r["path"] for r in rows)


def test_a_photo_already_at_the_target_size_is_kept_byte_for_byte_but_still_checked():
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buffer, "JPEG")
    photo = buffer.getvalue()
    assert square_jpeg_from_bytes(photo, 32, quality=90) == photo  # no second lossy encoding
    assert square_jpeg_from_bytes(photo, 16, quality=90) != photo  # other sizes are resized
    with pytest.raises(OSError):
        square_jpeg_from_bytes(photo[: len(photo) // 2], 32, quality=90)  # a damaged file is still refused
