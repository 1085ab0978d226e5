"""Properties of spec loading and ``--set`` overrides, checked on generated input.

(a) Whatever a spec file holds, loading it either succeeds or raises ``SpecError``.
(b) A spec built from valid field values loads, and every field comes back as written.
(c) ``KEY=VALUE`` overrides put the YAML-parsed value at the dotted path; malformed
    overrides raise ``SpecError`` and nothing else.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile
import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.errors import SpecError
from jobs.loader import load_spec
from jobs.overrides import apply_overrides, parse_override
from jobs.secrets import shown_setting
from jobs.spec import parse_size

# Generated cases must stay inside the suite's time budget; a slow example is a finding. Every run of the
# suite draws new cases, so 50 a run adds up (drawing them, not checking them, is most of the cost: 6.5
# CPU-seconds for 100); RAYJOBS_PROPERTY_EXAMPLES=2000 searches harder in one go.
BOUNDED = settings(max_examples=int(os.environ.get("RAYJOBS_PROPERTY_EXAMPLES", "50")), deadline=2000,
                   suppress_health_check=[HealthCheck.too_slow])

# Characters YAML gives meaning to, so that generated text reaches the parser's corners
# (flow collections, anchors, tags, block scalars, documents) rather than stopping at line 1.
YAML_ALPHABET = st.sampled_from(list(":-[]{}\n\t '\"&*!#|>%@`,?.~<=\\") + ["name", "entrypoint", "runtime_env",
                                                                          "workload", "kind", "---", "!!", "1", "a"])
yaml_like_text = st.lists(YAML_ALPHABET, max_size=80).map("".join)

# One folder for every generated file: per-example temporary folders would dominate the run time.
_SCRATCH = Path(tempfile.mkdtemp(prefix="rayjobs-properties-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)


def _load_bytes(data: bytes):
    path = _SCRATCH / "spec.yaml"
    path.write_bytes(data)
    return load_spec(path)


def _loads_or_spec_error(data: bytes) -> None:
    try:
        _load_bytes(data)
    except SpecError as exc:
        assert str(exc).startswith(str(_SCRATCH / "spec.yaml")), str(exc)


# --- (a) the loader never fails with anything but SpecError -------------------------------------


@BOUNDED
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_load_or_raise_spec_error(data):
    _loads_or_spec_error(data)


@BOUNDED
@given(st.text(max_size=500))
def test_arbitrary_text_loads_or_raises_spec_error(text):
    _loads_or_spec_error(text.encode("utf-8"))


@BOUNDED
@given(yaml_like_text)
def test_yaml_shaped_text_loads_or_raises_spec_error(text):
    _loads_or_spec_error(text.encode("utf-8"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
FIELD_NAMES = ["name", "entrypoint", "runtime_env", "entrypoint_num_cpus", "entrypoint_memory", "entrypoint_resources",
               "metadata", "submission_id", "address", "timeout_s", "max_retries", "workload", "env_vars", "pip"]


@BOUNDED
@given(st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=10), json_values, max_size=8))
def test_arbitrary_mappings_load_or_raise_spec_error(mapping):
    # Right field names with wrong values of every type reach pydantic, not just the YAML layer.
    _loads_or_spec_error(yaml.safe_dump(mapping, allow_unicode=True).encode("utf-8"))


# --- (b) valid specs round-trip -------------------------------------------------------------------

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
# NEL and the Unicode line/paragraph separators are line breaks to a YAML 1.1 reader, and
# PyYAML's emitter writes them unescaped, so they cannot survive a dump/load round trip.
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x85\u2028\u2029"), max_size=30)
# `<<` as a plain key is a merge key in YAML and PyYAML's dumper does not quote it.
keys = texts.filter(lambda key: key != "<<")
amounts = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
sizes = st.integers(min_value=0, max_value=2**50) | st.builds(
    lambda number, unit: f"{number}{unit}", st.integers(0, 4096), st.sampled_from(["", "K", "MB", "Gi", "GiB", "mi"])
)
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
# Ray's resource names as the spec takes them (they reach a shell in a KubeRay export).
resource_names = st.from_regex(r"[A-Za-z0-9_.:/-]{1,20}", fullmatch=True)
env_values = texts | st.integers() | st.booleans()

valid_specs = st.fixed_dictionaries(
    {"name": names, "entrypoint": texts.filter(lambda s: s.strip())},
    optional={
        "entrypoint_num_cpus": amounts,
        "entrypoint_num_gpus": amounts,
        "entrypoint_memory": sizes,
        "entrypoint_resources": st.dictionaries(resource_names, amounts, max_size=3),
        "entrypoint_label_selector": st.dictionaries(keys, texts, max_size=3),
        "metadata": st.dictionaries(keys, texts, max_size=3),
        "submission_id": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,40}", fullmatch=True),
        "address": st.builds(lambda scheme, host, port: f"{scheme}://{host}:{port}",
                             st.sampled_from(["http", "https"]), st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
                             st.integers(1, 65535)),
        "timeout_s": st.floats(min_value=0.001, max_value=1e7),
        "start_timeout_s": st.floats(min_value=0.001, max_value=1e7),
        "max_retries": st.integers(0, 100),
        "runtime_env": st.fixed_dictionaries({}, optional={
            "working_dir": st.just("."),
            "env_vars": st.dictionaries(env_names, env_values, max_size=4),
            "pip": st.lists(texts, max_size=3),
            "excludes": st.lists(texts, max_size=3),
        }),
    },
)


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@BOUNDED
@given(valid_specs)
def test_valid_specs_round_trip(fields):
    loaded = _load_bytes(yaml.safe_dump(fields, allow_unicode=True).encode("utf-8")).spec
    for key, value in fields.items():
        got = getattr(loaded, key)
        if key == "entrypoint_memory":
            assert got == parse_size(value)
        elif key == "runtime_env":
            env = got.model_dump(exclude_none=True)
            expected = dict(value)
            if "working_dir" in expected:
                expected["working_dir"] = str(_SCRATCH.resolve())
            if "env_vars" in expected:
                expected["env_vars"] = {k: _env_text(v) for k, v in expected["env_vars"].items()}
            assert {k: env[k] for k in expected} == expected
        else:
            assert got == value, key


# --- (c) overrides --------------------------------------------------------------------------------

key_parts = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
dotted_keys = st.lists(key_parts, min_size=1, max_size=5)
scalars = (st.none() | st.booleans() | st.integers()
           | st.floats(allow_nan=False) | st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30))
override_values = scalars | st.lists(scalars, max_size=3) | st.dictionaries(key_parts, scalars, max_size=3)


def _as_yaml(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=math.inf)
    return text.removesuffix("\n...\n").removesuffix("\n")


def _read_path(data: Any, path: list[str]) -> Any:
    for part in path:
        data = data[part]
    return data


@BOUNDED
@given(dotted_keys, override_values)
def test_override_puts_the_parsed_value_at_the_path(path, value):
    text = f"{'.'.join(path)}={_as_yaml(value)}"
    assert parse_override(text) == (tuple(path), value)
    data: dict[str, Any] = {"name": "demo"}
    applied = apply_overrides(data, [text])
    assert applied == {tuple(path): f"--set {shown_setting(text)}"}
    assert _read_path(data, path) == value


@BOUNDED
@given(st.text(max_size=60))
def test_arbitrary_override_text_raises_only_spec_error(text):
    try:
        parse_override(text)
    except SpecError as exc:
        assert str(exc).startswith(f"--set {shown_setting(text)}")


@BOUNDED
@given(st.dictionaries(key_parts, json_values, max_size=4), st.lists(yaml_like_text | st.text(max_size=30), max_size=3))
def test_overrides_on_any_data_apply_or_raise_spec_error(data, overrides):
    try:
        apply_overrides(data, overrides)
    except SpecError:
        pass


@BOUNDED
@given(dotted_keys, st.sampled_from(["{}..", "{}.", ".{}", "{}..x", ".", ""]), scalars)
def test_malformed_keys_are_refused(path, shape, value):
    key = shape.format(".".join(path))
    try:
        parse_override(f"{key}={_as_yaml(value)}")
    except SpecError:
        return
    raise AssertionError(f"{key!r} was accepted")
