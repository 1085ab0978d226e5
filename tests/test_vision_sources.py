"""Listing of the vision sources: classes, labels, splits, caps and input errors (no Ray needed)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.support.shared_data import FOOD101_SAMPLE as SAMPLE
from tests.support.images import make_food101_tree, make_hf_shards, make_imagefolder_tree
from workloads.vision.config import DataConfig
from workloads.vision.errors import DataSourceError
from workloads.vision.sources.listing import display_name, food101_folder, split_train_val
from workloads.vision.sources.photos import FOOD101_CLASSES, list_source


FOOD_COUNTS = {"pizza": (6, 2), "hamburger": (4, 2), "fried_rice": (5, 3), "breakfast_burrito": (3, 1)}


def per_class(listing, split):
    return Counter(listing.classes[item.label] for item in listing.items if item.split == split)


@pytest.fixture(scope="module")
def food101_root(tmp_path_factory) -> Path:
    return make_food101_tree(tmp_path_factory.mktemp("food101"), FOOD_COUNTS)


def test_food101_class_list_is_the_official_one():
    assert len(FOOD101_CLASSES) == 101 and len(set(FOOD101_CLASSES)) == 101
    # The official order sorts names as if underscores were absent.
    assert list(FOOD101_CLASSES) == sorted(FOOD101_CLASSES, key=lambda n: n.replace("_", ""))
    assert FOOD101_CLASSES.index("cheesecake") == 16 and FOOD101_CLASSES.index("cheese_plate") == 17
    assert FOOD101_CLASSES[0] == "apple_pie" and FOOD101_CLASSES[-1] == "waffles"
    assert FOOD101_CLASSES.index("pizza") == 76 and FOOD101_CLASSES.index("hamburger") == 53


@pytest.mark.parametrize(
    "name, folder",
    [
        ("fried rice", "fried_rice"),
        ("hot dog", "hot_dog"),
        ("pancake", "pancakes"),
        ("burrito", "breakfast_burrito"),
        ("caesar salad", "caesar_salad"),
        ("Pizza", "pizza"),
        ("fried_rice", "fried_rice"),
        ("pancakes", "pancakes"),
    ],
)
def test_display_names_map_to_food101_folders(name, folder):
    assert food101_folder(name) == folder
    assert folder in FOOD101_CLASSES


def test_every_lite_class_maps_to_a_food101_folder():
    for name in DataConfig().classes:
        assert food101_folder(name) in FOOD101_CLASSES, name
    assert display_name("fried_rice") == "fried rice"


@pytest.mark.parametrize("point_at", ["food-101 folder", "its parent"])
def test_food101_lists_official_split_with_labels_in_requested_order(food101_root, point_at):
    root = food101_root if point_at == "food-101 folder" else food101_root.parent
    data = DataConfig(source="food101", root=root, classes=["fried rice", "pizza", "burrito"])
    listing = list_source(data)
    assert listing.classes == ["fried rice", "pizza", "burrito"]
    assert listing.folders == ["fried_rice", "pizza", "breakfast_burrito"]
    assert per_class(listing, "train") == {"fried rice": 5, "pizza": 6, "burrito": 3}
    assert per_class(listing, "val") == {"fried rice": 3, "pizza": 2, "burrito": 1}
    test_ids = set((food101_root / "meta" / "test.txt").read_text().split())
    for item in listing.items:
        assert item.file.is_file()
        assert item.file.parent.name == listing.folders[item.label]
        image_id = f"{item.file.parent.name}/{item.file.stem}"
        assert (item.split == "val") == (image_id in test_ids)


def test_food101_json_meta_and_max_per_class(tmp_path):
    root = make_food101_tree(tmp_path, {"pizza": (5, 3), "sushi": (4, 2)}, meta_format="json")
    assert not (root / "meta" / "train.txt").exists()
    listing = list_source(DataConfig(source="food101", root=root, classes=["sushi", "pizza"], max_per_class=2))
    assert per_class(listing, "train") == {"sushi": 2, "pizza": 2}
    assert per_class(listing, "val") == {"sushi": 2, "pizza": 2}
    # The cap is a seeded sample: the same seed picks the same files.
    again = list_source(DataConfig(source="food101", root=root, classes=["sushi", "pizza"], max_per_class=2))
    assert [i.path for i in again.items] == [i.path for i in listing.items]


def test_unknown_class_error_names_class_folder_and_available(food101_root):
    with pytest.raises(DataSourceError) as err:
        list_source(DataConfig(source="food101", root=food101_root, classes=["pizza", "hot dog"]))
    message = str(err.value)
    assert "'hot dog'" in message and "hot_dog" in message
    assert "breakfast_burrito" in message and "pizza" in message  # what exists


def test_class_listed_but_without_images_is_an_error(tmp_path):
    root = make_food101_tree(tmp_path, {"pizza": (3, 1), "sushi": (2, 1)})
    classes_txt = root / "meta" / "classes.txt"
    classes_txt.write_text(classes_txt.read_text() + "ramen\n")
    with pytest.raises(DataSourceError) as err:
        list_source(DataConfig(source="food101", root=root, classes=["pizza", "ramen"]))
    message = str(err.value)
    assert "'ramen'" in message and "no images" in message and str(root / "images" / "ramen") in message
    assert "pizza, sushi" in message


def test_same_class_twice_is_an_error(food101_root):
    with pytest.raises(DataSourceError, match="twice"):
        list_source(DataConfig(source="food101", root=food101_root, classes=["pancake", "pancakes"]))


@pytest.mark.parametrize("source", ["food101", "hf_parquet", "imagefolder"])
def test_missing_root_says_what_to_set(tmp_path, source):
    with pytest.raises(DataSourceError) as err:
        list_source(DataConfig(source=source, root=tmp_path / "nowhere", classes=["pizza", "sushi"]))
    assert str(tmp_path / "nowhere") in str(err.value)
    assert "--set workload.data.root=" in str(err.value)


def test_wrong_layout_says_what_was_looked_for(tmp_path):
    (tmp_path / "random").mkdir()
    with pytest.raises(DataSourceError) as err:
        list_source(DataConfig(source="food101", root=tmp_path, classes=["pizza", "sushi"]))
    assert "meta/classes.txt" in str(err.value) and "images/<class>/<id>.jpg" in str(err.value)
    with pytest.raises(DataSourceError, match="train-00000-of-00008.parquet"):
        list_source(DataConfig(source="hf_parquet", root=tmp_path, classes=["pizza", "sushi"]))
    with pytest.raises(DataSourceError, match="no class folders"):
        list_source(DataConfig(source="imagefolder", root=tmp_path / "random", classes=["pizza", "sushi"]))


def test_hf_parquet_reads_labels_by_row_group(tmp_path):
    base = make_hf_shards(tmp_path, {"pizza": (5, 2), "sushi": (3, 2), "ramen": (4, 1)}, rows_per_group=3)
    listing = list_source(DataConfig(source="hf_parquet", root=base, classes=["sushi", "pizza"]))
    assert listing.classes == ["sushi", "pizza"]
    assert per_class(listing, "train") == {"sushi": 3, "pizza": 5}
    assert per_class(listing, "val") == {"sushi": 2, "pizza": 2}
    assert {i.shard.name.split("-")[0] for i in listing.items if i.split == "train"} == {"train"}
    assert {i.shard.name.split("-")[0] for i in listing.items if i.split == "val"} == {"validation"}
    import pyarrow.parquet as pq

    for item in listing.items:
        label = pq.ParquetFile(item.shard).read_row_group(item.row_group, columns=["label"]).column("label")
        assert FOOD101_CLASSES[label[item.row].as_py()] == listing.folders[item.label]
    assert len(listing.signature) == 3  # two train shards, one validation shard


def test_hf_parquet_without_validation_splits_train(tmp_path):
    base = make_hf_shards(tmp_path, {"pizza": (10, 0), "sushi": (10, 0)}, val_shards=1)
    for shard in (base / "data").glob("validation-*"):
        shard.unlink()
    listing = list_source(DataConfig(source="hf_parquet", root=base, classes=["pizza", "sushi"], val_fraction=0.3))
    assert per_class(listing, "train") == {"pizza": 7, "sushi": 7}
    assert per_class(listing, "val") == {"pizza": 3, "sushi": 3}


def test_hf_parquet_unknown_class_lists_present_ones(tmp_path):
    base = make_hf_shards(tmp_path, {"pizza": (2, 1), "sushi": (2, 1)})
    with pytest.raises(DataSourceError) as err:
        list_source(DataConfig(source="hf_parquet", root=base, classes=["pizza", "hot dog"]))
    assert "'hot dog'" in str(err.value) and "hot_dog" in str(err.value) and "sushi" in str(err.value)


def test_imagefolder_split_is_seeded_and_stratified(tmp_path):
    root = make_imagefolder_tree(tmp_path / "imgs", {"pizza": 10, "fried rice": 5})
    (root / "pizza" / "notes.txt").write_text("not an image extension, ignored")
    data = DataConfig(source="imagefolder", root=root, classes=["pizza", "fried rice"], val_fraction=0.2)
    listing = list_source(data)
    assert listing.folders == ["pizza", "fried rice"]  # the folder as written
    assert per_class(listing, "train") == {"pizza": 8, "fried rice": 4}
    assert per_class(listing, "val") == {"pizza": 2, "fried rice": 1}
    assert [i.path for i in list_source(data).items] == [i.path for i in listing.items]
    other_seed = list_source(data.model_copy(update={"seed": 7}))
    assert {i.path for i in other_seed.items if i.split == "val"} != {i.path for i in listing.items if i.split == "val"}


def test_imagefolder_empty_class_is_an_error(tmp_path):
    root = make_imagefolder_tree(tmp_path / "imgs", {"pizza": 3})
    (root / "sushi").mkdir()
    with pytest.raises(DataSourceError) as err:
        list_source(DataConfig(source="imagefolder", root=root, classes=["pizza", "sushi"]))
    assert "'sushi'" in str(err.value) and "no images" in str(err.value)


def test_split_keeps_one_image_on_each_side():
    assert split_train_val(["a", "b"], 0.01, 0, "k")[1] != []
    assert split_train_val(["a", "b"], 0.99, 0, "k")[0] != []
    assert split_train_val(["a"], 0.5, 0, "k") == (["a"], [])


def test_synthetic_listing_counts_and_determinism():
    data = DataConfig(source="synthetic", classes=["red", "green", "blue"], synthetic_per_class=10, val_fraction=0.2)
    listing = list_source(data)
    assert per_class(listing, "train") == {"red": 8, "green": 8, "blue": 8}
    assert per_class(listing, "val") == {"red": 2, "green": 2, "blue": 2}
    assert [i.synthetic_seed for i in list_source(data).items] == [i.synthetic_seed for i in listing.items]
    assert len({i.synthetic_seed for i in listing.items}) == 30


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"real Food-101 sample not present at {SAMPLE} (kept outside the repo)")
def test_real_food101_sample_listing():
    classes = ["pizza", "hamburger", "sushi", "ramen", "steak", "burrito"]
    listing = list_source(DataConfig(source="food101", root=SAMPLE, classes=classes))
    assert per_class(listing, "train") == {"pizza": 15, "hamburger": 6, "sushi": 15, "ramen": 6, "steak": 15, "burrito": 15}
    assert per_class(listing, "val") == {"pizza": 5, "hamburger": 2, "sushi": 5, "ramen": 2, "steak": 5, "burrito": 5}
    with pytest.raises(DataSourceError, match="fried_rice"):
        list_source(DataConfig(source="food101", root=SAMPLE))  # the full Lite list: 4 classes are absent
