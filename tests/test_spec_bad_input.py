"""Malformed input through the entry points: every bad spec in the corpus is refused by
``rayjobs validate`` and ``rayjobs submit`` with exit code 2, one message naming the file
(and the field), no traceback, nothing on stdout and no network use; malformed image data
is refused with a clear error or skipped and counted.

Every case goes through the command in-process (typer's runner); the real ``rayjobs``
process gets the whole corpus in one ``validate`` and a few cases of ``submit``, which is
where a traceback or a wrong exit status of the real process would show. How fast a spec
is refused is measured by ``benchmarks/refusal_latency.py``, not here.

The corpus lives in ``tests/corpus/specs``. Files that cannot sensibly be checked in
(binary, huge, alias bombs, other encodings, directories) are made here, per test.
"""

from __future__ import annotations

import codecs
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.errors import SpecError
from jobs.loader import load_spec
from jobs.yaml_reader import MAX_SPEC_BYTES
from tests.support.cli import rayjobs_in_process, run_rayjobs
from tests.support.images import jpeg_bytes, make_hf_shards, write_text_as_jpeg, write_truncated_jpeg
from workloads.vision.config import DataConfig
from workloads.vision.errors import DataSourceError
from workloads.vision.preprocess.payloads import PayloadReader, Skip, encode_payload
from workloads.vision.sources.listing import SourceItem
from workloads.vision.sources.photos import list_source

CORPUS = Path(__file__).resolve().parent / "corpus" / "specs"

# A port nothing listens on: a spec that got as far as the network would exit 4, not 2.
CLOSED_ADDRESS = "http://127.0.0.1:9"

# corpus file → (field named in the message or None, fragments the message must contain)
CHECKED_IN: dict[str, tuple[str | None, list[str]]] = {
    "syntax_unclosed_flow.yaml": (None, ["not valid YAML", "expected ',' or '}'"]),
    "syntax_tab_indent.yaml": (None, ["not valid YAML", "'\\t'", ":4:"]),
    "syntax_bad_indent.yaml": (None, ["not valid YAML", "mapping values are not allowed", ":2:"]),
    "syntax_undefined_alias.yaml": (None, ["not valid YAML", "undefined alias 'command'"]),
    "multiple_documents.yaml": (None, ["not valid YAML", "another document", ":3:"]),
    "type_entrypoint_list.yaml": ("entrypoint", ["valid string"]),
    "type_name_number.yaml": ("name", ["valid string", "42"]),
    "type_runtime_env_list.yaml": ("runtime_env", ["valid dictionary"]),
    "type_num_cpus_text.yaml": ("entrypoint_num_cpus", ["valid number", "'two'"]),
    "typo_top_level.yaml": ("timout_s", ["unknown field", "did you mean 'timeout_s'?"]),
    "typo_runtime_env.yaml": ("runtime_env.working_directory", ["unknown field", "did you mean 'working_dir'?"]),
    "typo_workload.yaml": ("workload.train.batchsize", ["unknown field", "did you mean 'batch_size'?"]),
    "workload_unknown_kind.yaml": ("workload.kind", ["unknown workload kind 'visoin'", "vision"]),
    "workload_relative_kind.yaml": ("workload.kind", ["'.params:Model'"]),
    "limit_negative_cpus.yaml": ("entrypoint_num_cpus", ["must not be negative"]),
    "limit_nan_gpus.yaml": ("entrypoint_num_gpus", ["finite"]),
    "limit_inf_resource.yaml": ("entrypoint_resources.TPU", ["finite"]),
    "limit_name_too_long.yaml": ("name", ["at most 63 characters"]),
    "limit_timeout_zero.yaml": ("timeout_s", ["greater than 0"]),
    "limit_max_retries.yaml": ("max_retries", ["less than or equal to 100"]),
    "limit_inf_backoff.yaml": ("retry_backoff.max_s", ["finite", ":6:"]),
    "limit_nan_backoff.yaml": ("retry_backoff.initial_s", ["finite", ":5:"]),
    "limit_backoff_past_a_day.yaml": ("retry_backoff.max_s", ["less than or equal to 86400", ":6:"]),
    "tag_python_object_apply.yaml": ("entrypoint", ["'!!python/object/apply:os.system' is not allowed"]),
    "tag_custom.yaml": ("metadata", ["'!foo' is not allowed"]),
    "duplicate_top_level.yaml": ("timeout_s", ["duplicate key 'timeout_s' (first defined on line 3)", ":4:"]),
    "duplicate_nested.yaml": ("runtime_env.env_vars.MODE", ["duplicate key 'MODE' (first defined on line 5)", ":6:"]),
    "empty.yaml": (None, ["the file is empty"]),
    "comments_only.yaml": (None, ["holds no YAML document"]),
    "list_not_mapping.yaml": (None, ["must be a mapping", "got a list"]),
    "scalar_not_mapping.yaml": (None, ["must be a mapping", "got a single value"]),
    "key_not_text.yaml": (None, ["keys must be text", "8265"]),
    "merge_non_mapping.yaml": ("metadata", ["'<<' merges only mappings"]),
    "missing_working_dir.yaml": ("runtime_env.working_dir", ["'./no-such-project' does not exist"]),
    "missing_py_modules.yaml": ("runtime_env.py_modules", ["'./no_such_module' does not exist"]),
    "working_dir_is_a_file.yaml": ("runtime_env.working_dir", ["'empty.yaml' is not a directory"]),
    "working_dir_name_too_long.yaml": ("runtime_env.working_dir", ["xxxxxxxx"]),
    "working_dir_unknown_user.yaml": ("runtime_env.working_dir", ["~no-such-user-rayjobs/project"]),
    "workload_root_unknown_user.yaml": ("workload.data.root", ["~no-such-user-rayjobs/images"]),
    "pip_and_conda.yaml": ("runtime_env", ["pip and conda cannot be used together"]),
    "env_vars_list_value.yaml": ("runtime_env.env_vars.OMP_NUM_THREADS", ["must be text, got a list"]),
    "env_vars_bad_name.yaml": ("runtime_env.env_vars", ["'1ST_TRY' is not a valid environment variable name"]),
    "ray_client_address.yaml": ("address", ["scheme 'ray'", "http://host:8265"]),
}


def _alias_bomb() -> bytes:
    # Nine levels of nine-fold aliases: 9**9 values if expanded, a few hundred bytes on disk.
    lines = ["name: demo", "entrypoint: run", 'a: &a ["x","x","x","x","x","x","x","x","x"]']
    for previous, current in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{current}: &{current} [" + ",".join([f"*{previous}"] * 9) + "]")
    return ("\n".join(lines) + "\n").encode()


def _write(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(directory: Path) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    return make


def _make_directory(directory: Path) -> Path:
    path = directory / "a-directory.yaml"
    path.mkdir()
    return path


# name → (how to make it under a folder, field or None, fragments)
GENERATED: dict[str, tuple[Callable[[Path], Path], str | None, list[str]]] = {
    "latin1": (_write("latin1.yaml", "name: démo\nentrypoint: run\n".encode("latin-1")), None,
               ["is not UTF-8 text", "save it as UTF-8"]),
    "utf16_bom": (_write("utf16.yaml", codecs.BOM_UTF16_LE + "name: demo\nentrypoint: run\n".encode("utf-16-le")), None,
                  ["UTF-16", "save it as UTF-8"]),
    "nul_bytes": (_write("nul.yaml", b"name: demo\x00\nentrypoint: run\n"), None, ["binary file"]),
    "binary_png": (_write("picture.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))), None,
                   ["binary file"]),
    "control_character": (_write("ansi.yaml", b"name: demo\nentrypoint: \x1b[31mrun\x1b[0m\n"), None,
                          ["not valid YAML", "U+001B", ":2:"]),
    "huge": (_write("huge.yaml", b"name: demo\nentrypoint: run\n# " + b"x" * MAX_SPEC_BYTES + b"\n"), None,
             ["bytes", "limit"]),
    "alias_bomb": (_write("bomb.yaml", _alias_bomb()), None, ["expands to more than"]),
    "deeply_nested": (_write("deep.yaml", b"name: demo\nentrypoint: run\nmetadata: " + b"[" * 5000 + b"]" * 5000 + b"\n"),
                      None, ["nested too deeply"]),
    "directory": (_make_directory, None, ["is a directory"]),
    "missing_file": (lambda directory: directory / "no-such-spec.yaml", None, ["no such file"]),
}


@dataclass(frozen=True)
class Case:
    name: str
    field: str | None
    fragments: list[str]
    make: Callable[[Path], Path]


def _checked_in_case(name: str) -> Case:
    field, fragments = CHECKED_IN[name]
    return Case(name, field, fragments, lambda _directory: CORPUS / name)


CASES = [_checked_in_case(name) for name in sorted(CHECKED_IN)] + [
    Case(name, field, fragments, make) for name, (make, field, fragments) in GENERATED.items()
]


def check_message(stderr: str, path: Path, case: Case) -> None:
    """One line, starting with the file, naming the field, saying what is wrong, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one message, got:\n{stderr}"
    message = lines[0]
    assert message.startswith(f"{path}:"), message
    if case.field is not None:
        assert f": {case.field}: " in message, f"field {case.field!r} not named in: {message}"
    for fragment in case.fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"


def test_corpus_folder_and_table_agree():
    on_disk = {p.name for p in CORPUS.iterdir()}
    assert on_disk == set(CHECKED_IN)
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_validate_refuses(case, tmp_path):
    path = case.make(tmp_path)
    result = rayjobs_in_process("validate", str(path), home=tmp_path, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    check_message(result.stderr, path, case)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_submit_refuses_before_any_network_use(case, tmp_path):
    path = case.make(tmp_path)
    result = rayjobs_in_process("submit", str(path), "--address", CLOSED_ADDRESS, home=tmp_path, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    check_message(result.stderr, path, case)
    assert "cannot reach" not in result.stderr
    # The python/object/apply payload would have created this file in the working directory.
    assert not (tmp_path / "rayjobs-corpus-pwned").exists()


# The real process, for a syntax error, a code-running tag and a bomb: what it prints and its exit status.
REAL_PROCESS_CASES = ["syntax_unclosed_flow.yaml", "tag_python_object_apply.yaml", "alias_bomb"]


@pytest.mark.parametrize("case", [case for case in CASES if case.name in REAL_PROCESS_CASES], ids=lambda c: c.name)
def test_the_real_submit_command_refuses_before_any_network_use(case, tmp_path):
    path = case.make(tmp_path)
    result = run_rayjobs("submit", str(path), "--address", CLOSED_ADDRESS, home=tmp_path, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    check_message(result.stderr, path, case)
    assert not (tmp_path / "rayjobs-corpus-pwned").exists()


def test_a_valid_spec_does_reach_the_closed_address(tmp_path):
    # The control for the test above: exit 2 there means "refused", not "any failure".
    path = tmp_path / "ok.yaml"
    path.write_text("name: demo\nentrypoint: run\n")
    result = run_rayjobs("submit", str(path), "--address", CLOSED_ADDRESS, "--give-up-after", "1",
                         home=tmp_path, cwd=tmp_path, timeout=60)
    assert result.returncode == 4, result.stderr
    assert "Traceback" not in result.stderr


def test_validate_reports_every_file_of_a_batch(tmp_path):
    paths = [case.make(tmp_path) for case in CASES]
    valid = tmp_path / "fine.yaml"
    valid.write_text("name: demo\nentrypoint: run\n")
    result = run_rayjobs("validate", str(valid), *map(str, paths), home=tmp_path, cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert result.stdout == f"{valid}: ok (demo)\n"
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == len(paths)
    for line, path in zip(lines, paths):
        assert line.startswith(f"{path}:"), line


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_load_spec_raises_only_spec_error(case, tmp_path):
    path = case.make(tmp_path)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    check_message(str(caught.value), path, case)


def test_spec_read_from_an_endless_pipe_is_bounded(tmp_path):
    # A FIFO reports size 0, so only a bounded read protects against /dev/zero-like input.
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    written = []

    def writer() -> None:
        try:
            with open(fifo, "wb") as handle:
                for _ in range(64):  # 4 MiB, more than the limit
                    handle.write(b"# " + b"x" * (64 * 1024 - 3) + b"\n")
                    written.append(1)
        except BrokenPipeError:
            pass  # the reader stopped early, which is the point

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with pytest.raises(SpecError, match="limit"):
        load_spec(fifo)
    thread.join(timeout=10)
    assert len(written) < 64


# --- malformed image data ----------------------------------------------------------------------

IMAGE_SIZE, QUALITY = 16, 90


@pytest.mark.parametrize(("name", "make", "reason"), [
    ("zero_bytes", lambda p: p.write_bytes(b""), "not_an_image"),
    ("jpeg_header_only", lambda p: p.write_bytes(jpeg_bytes((10, 20, 30))[:20]), "not_an_image"),
    ("truncated_jpeg", write_truncated_jpeg, "corrupt"),
    ("text_named_jpg", write_text_as_jpeg, "not_an_image"),
])
def test_bad_image_files_are_skipped_with_a_reason(tmp_path, name, make, reason):
    path = tmp_path / f"{name}.jpg"
    make(path)
    # Both ways a worker gets an image: a path on one node, the bytes on several.
    assert encode_payload(str(path), IMAGE_SIZE, QUALITY) == (None, reason)
    assert encode_payload(path.read_bytes(), IMAGE_SIZE, QUALITY) == (None, reason)


def test_a_directory_named_like_an_image_is_unreadable_not_a_crash(tmp_path):
    folder = tmp_path / "photo.jpg"
    folder.mkdir()
    assert encode_payload(str(folder), IMAGE_SIZE, QUALITY) == (None, "unreadable")


def _image_type() -> pa.DataType:
    return pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])


def _write_shard(base: Path, name: str, table: pa.Table) -> Path:
    (base / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, base / "data" / name)
    return base


def _hf(root: Path, **extra) -> DataConfig:
    return DataConfig(source="hf_parquet", root=root, classes=["pizza", "sushi"], **extra)


def test_hf_empty_shard_alone_is_a_clear_error(tmp_path):
    schema = pa.schema([pa.field("image", _image_type()), pa.field("label", pa.int64())])
    root = _write_shard(tmp_path, "train-00000-of-00001.parquet", schema.empty_table())
    with pytest.raises(DataSourceError, match="class 'pizza' has no images in the shards"):
        list_source(_hf(root))


def test_hf_empty_shard_beside_full_ones_adds_nothing(tmp_path):
    root = make_hf_shards(tmp_path, {"pizza": (3, 1), "sushi": (2, 1)})
    schema = pq.read_schema(next((root / "data").glob("train-*.parquet")))
    _write_shard(root, "train-00009-of-00010.parquet", schema.empty_table())
    listing = list_source(_hf(root))
    assert listing.count("train") == 5 and listing.count("val") == 2


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "Parquet file size is 0 bytes"),
    (b"name: not parquet\n", "cannot read Parquet shard"),
])
def test_hf_unreadable_shard_is_named(tmp_path, content, expected):
    root = make_hf_shards(tmp_path, {"pizza": (2, 1), "sushi": (2, 1)})
    bad = root / "data" / "train-00007-of-00008.parquet"
    bad.write_bytes(content)
    with pytest.raises(DataSourceError) as caught:
        list_source(_hf(root))
    assert expected in str(caught.value) and str(bad) in str(caught.value)


def test_hf_shard_without_image_column(tmp_path):
    root = _write_shard(tmp_path, "train-00000-of-00001.parquet", pa.table({"img": [b"x"], "label": [76]}))
    with pytest.raises(DataSourceError, match=r"expected columns 'image'.*found \['img', 'label'\]"):
        list_source(_hf(root))


@pytest.mark.parametrize("labels", [["pizza", "sushi"], [76.0, float("nan")]], ids=["text", "float-nan"])
def test_hf_shard_with_non_integer_labels_is_a_clear_error(tmp_path, labels):
    image = {"bytes": jpeg_bytes((200, 40, 40)), "path": None}
    root = _write_shard(tmp_path, "train-00000-of-00001.parquet",
                        pa.table({"image": pa.array([image, image], _image_type()), "label": labels}))
    with pytest.raises(DataSourceError, match="label"):
        list_source(_hf(root))


def test_hf_row_without_image_bytes_is_skipped_as_missing(tmp_path):
    shard = tmp_path / "train-00000-of-00001.parquet"
    images = pa.array([None, {"bytes": None, "path": "x.jpg"}, {"bytes": jpeg_bytes((1, 2, 3)), "path": None}],
                      _image_type())
    pq.write_table(pa.table({"image": images, "label": [76, 76, 76]}), shard)
    reader = PayloadReader(num_classes=2, ship_file_bytes=True)
    payloads = [reader.payload(SourceItem("train", 0, f"row{i}", shard=shard, row_group=0, row=i)) for i in range(3)]
    assert payloads[0] == Skip("missing") and payloads[1] == Skip("missing")
    jpeg, reason = encode_payload(payloads[2], IMAGE_SIZE, QUALITY)
    assert reason is None and jpeg.startswith(b"\xff\xd8")


def test_plain_equals_and_merge_signs_as_values_are_text(tmp_path):
    # YAML 1.1 resolves a lone `=` and `<<` to tags no spec author means to write.
    path = tmp_path / "ok.yaml"
    path.write_text("name: demo\nentrypoint: run\nmetadata:\n  op: =\n  arrow: <<\n")
    assert load_spec(path).spec.metadata == {"op": "=", "arrow": "<<"}
    assert load_spec(path, ["metadata.op=="]).spec.metadata["op"] == "="
