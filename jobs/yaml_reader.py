"""Safe, strict reading of YAML spec files.

PyYAML's ``safe_load`` still silently keeps the last of two duplicate keys,
expands aliases without bound and says nothing about where a value came from.
This reader composes the node tree and builds plain Python values itself so it
can refuse duplicates and custom tags, cap alias expansion, and remember the line
of every value for error messages.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml

from jobs.errors import FieldPath, SpecError

MAX_SPEC_BYTES = 1 << 20
MAX_VALUES = 100_000
MAX_DEPTH = 64

_STANDARD_TAG_PREFIX = "tag:yaml.org,2002:"
_SCALAR_TAGS = {"null", "bool", "int", "float", "str"}


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, file: str) -> None:
        self.loader = loader
        self.file = file
        self.values_built = 0
        self.lines: dict[FieldPath, int] = {}

    def fail(self, message: str, node: yaml.Node | None, path: FieldPath = ()) -> SpecError:
        line = node.start_mark.line + 1 if node is not None else None
        return SpecError.single(self.file, message, path, line)

    def build(self, node: yaml.Node, path: FieldPath) -> Any:
        self.values_built += 1
        if self.values_built > MAX_VALUES:
            raise self.fail(
                f"the document expands to more than {MAX_VALUES} values (aliases that multiply); refusing to load it",
                node,
            )
        if len(path) > MAX_DEPTH:
            raise self.fail(f"nested more than {MAX_DEPTH} levels deep", node, path)
        self.lines.setdefault(path, node.start_mark.line + 1)
        tag = node.tag or ""
        short_tag = tag[len(_STANDARD_TAG_PREFIX):] if tag.startswith(_STANDARD_TAG_PREFIX) else tag
        if isinstance(node, yaml.MappingNode) and short_tag == "map":
            return self._build_mapping(node, path)
        if isinstance(node, yaml.SequenceNode) and short_tag == "seq":
            return [self.build(item, (*path, index)) for index, item in enumerate(node.value)]
        if isinstance(node, yaml.ScalarNode) and short_tag in ("timestamp", "value", "merge"):
            # Dates stay text: a spec never needs a datetime object, and metadata must be strings.
            # A plain `=` or `<<` used as a value (not as a merge key) is text as well.
            return node.value
        if not isinstance(node, yaml.ScalarNode) or short_tag not in _SCALAR_TAGS:
            shown = "!!" + short_tag if tag.startswith(_STANDARD_TAG_PREFIX) else tag
            raise self.fail(f"the YAML tag {shown!r} is not allowed in a spec (only plain values, lists and mappings)",
                            node, path)
        return self.loader.construct_object(node)

    def _build_mapping(self, node: yaml.MappingNode, path: FieldPath, merging: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = {}
        key_lines: dict[str, int] = {}
        merged: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _STANDARD_TAG_PREFIX + "merge":
                merged.append(value_node)
                continue
            key = self.build(key_node, (*path, "<key>"))
            if isinstance(key, bool) and key_node.style is None:
                key = key_node.value  # YAML 1.1 reads a plain `on:` key (notify's) as true; a spec's keys are names
            if not isinstance(key, str):
                raise self.fail(f"keys must be text, got {key!r}; quote it", key_node, path)
            line = key_node.start_mark.line + 1
            if key in key_lines:
                raise self.fail(f"duplicate key {key!r} (first defined on line {key_lines[key]})",
                                key_node, (*path, key))
            key_lines[key] = line
            if not merging:
                self.lines[(*path, key)] = line
            result[key] = self.build(value_node, (*path, key))
        # ``<<: *defaults`` fills in keys the mapping does not set itself.
        for source in merged:
            sources = source.value if isinstance(source, yaml.SequenceNode) else [source]
            for mapping_node in sources:
                if not isinstance(mapping_node, yaml.MappingNode):
                    raise self.fail("'<<' merges only mappings", mapping_node, path)
                for key, value in self._build_mapping(mapping_node, path, merging=True).items():
                    result.setdefault(key, value)
        self.lines.pop((*path, "<key>"), None)
        return result


class _TooDeep(Exception):
    """Raised by the composer past :data:`_COMPOSE_DEPTH_LIMIT` levels."""


# PyYAML composes nodes recursively: a document thousands of brackets deep used to be refused only when Python's
# recursion limit gave way, after 1.6 CPU-seconds of unwinding. Composing stops well before that, and above
# MAX_DEPTH, so a document nested just past MAX_DEPTH still gets the builder's message naming the field.
_COMPOSE_DEPTH_LIMIT = 2 * MAX_DEPTH


class _DepthLimitedLoader(yaml.SafeLoader):
    _compose_depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self._compose_depth += 1
        try:
            if self._compose_depth > _COMPOSE_DEPTH_LIMIT:
                raise _TooDeep
            return super().compose_node(parent, index)
        finally:
            self._compose_depth -= 1


def _new_loader(text: str, source: str, with_line: bool = True) -> yaml.SafeLoader:
    # PyYAML checks every character as soon as the loader is made, before any parsing.
    try:
        return _DepthLimitedLoader(text)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1 if with_line else None
        raise SpecError.single(source, f"not valid YAML: the unprintable character U+{exc.character:04X} is not "
                                       "allowed; remove it, or write it as an escape inside double quotes", (), line) from None


def parse_yaml_mapping(text: str, file: str) -> tuple[dict[str, Any], dict[FieldPath, int]]:
    """Parse YAML text that must hold one mapping.

    Args:
        text: the YAML document.
        file: its name, for messages.

    Returns:
        The mapping, and the 1-based line of every field path in it.

    Raises:
        SpecError: invalid YAML, duplicate keys, or a document that is not a mapping.
    """
    if not text.strip():
        raise SpecError.single(file, "the file is empty; a spec needs at least 'name' and 'entrypoint'")
    loader = _new_loader(text, file)
    try:
        try:
            root = loader.get_single_node()
        except (RecursionError, _TooDeep):
            raise SpecError.single(file, "the document is nested too deeply") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            raise SpecError.single(file, f"not valid YAML: {problem}", (), mark.line + 1 if mark else None) from None
        if root is None:
            raise SpecError.single(file, "the file holds no YAML document; a spec needs 'name' and 'entrypoint'")
        builder = _Builder(loader, file)
        try:
            data = builder.build(root, ())
        except RecursionError:
            raise SpecError.single(file, "the document is nested too deeply") from None
        except yaml.YAMLError as exc:
            raise SpecError.single(file, f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({data!r:.40})"
        raise SpecError.single(file, f"a spec must be a mapping of fields (name: ..., entrypoint: ...), got {kind}")
    return data, builder.lines


def read_yaml_mapping(path: Path) -> tuple[dict[str, Any], dict[FieldPath, int]]:
    """Read a spec file, refusing anything that is not a small UTF-8 YAML mapping.

    Returns:
        As :func:`parse_yaml_mapping`.

    Raises:
        SpecError: the file is missing, unreadable, too large, not UTF-8, or not a YAML mapping.
    """
    file = str(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise SpecError.single(file, "is a directory, not a spec file")
        if size > MAX_SPEC_BYTES:
            raise SpecError.single(file, f"is {size} bytes; specs are limited to {MAX_SPEC_BYTES} bytes")
        with path.open("rb") as handle:
            # Bounded: a pipe or a device (/dev/zero) reports size 0 but may never end.
            raw = handle.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecError.single(file, f"is larger than {MAX_SPEC_BYTES} bytes, the limit for a spec")
    except FileNotFoundError:
        raise SpecError.single(file, "no such file") from None
    except PermissionError:
        raise SpecError.single(file, "permission denied") from None
    except OSError as exc:
        raise SpecError.single(file, f"cannot be read: {exc.strerror or exc}") from None
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # UTF-32 LE starts like UTF-16 LE
        raise SpecError.single(file, "is UTF-16 or UTF-32 text; save it as UTF-8")
    if b"\x00" in raw:
        raise SpecError.single(file, "is a binary file, not YAML text")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError.single(file, f"is not UTF-8 text (invalid byte at offset {exc.start}); save it as UTF-8") from None
    return parse_yaml_mapping(text, file)


def parse_yaml_value(text: str, source: str) -> Any:
    """Parse one YAML value (as in ``--set key=value``) with the same rules as a spec file."""
    loader = _new_loader(text, source, with_line=False)
    try:
        try:
            node = loader.get_single_node()
        except (RecursionError, _TooDeep):
            raise SpecError.single(source, "value is nested too deeply") from None
        except yaml.YAMLError as exc:
            raise SpecError.single(source, f"value is not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
        return None if node is None else _Builder(loader, source).build(node, ())
    finally:
        loader.dispose()
