"""The project layout in docs/development.md: it names every package and folder of the code, and names only files and
folders that exist (a file is looked for in the folder of its row, or under it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYOUT_PAGE = REPO_ROOT / "docs" / "development.md"
# Where the code lives: each of its folders with Python files must have a row.
CODE_ROOTS = ("rayjobs_agent", "jobs", "runner", "workloads")


def layout_rows() -> list[tuple[str, str]]:
    """``(folder, what the row says)`` for each row of the layout block, the folder relative to the repository."""
    text = LAYOUT_PAGE.read_text(encoding="utf-8").split("## Project layout", 1)[1]
    block = text.split("```", 2)[1]
    rows: list[tuple[str, str]] = []
    parents: dict[int, str] = {}
    for line in block.splitlines():
        match = re.match(r"^( *)(\S+/)( +(.*))?$", line)
        if match is not None and not line.startswith(" " * 10):
            depth = len(match[1]) // 2
            folder = parents.get(depth - 1, "") + match[2]
            parents[depth] = folder
            rows.append((folder.rstrip("/"), match[4] or ""))
        elif rows and line.strip():
            rows[-1] = (rows[-1][0], rows[-1][1] + " " + line.strip())
    return rows


def named_files(text: str) -> list[str]:
    """The file and folder names a row's words name: ``supervisor.py``, ``sources/``."""
    return re.findall(r"(?<![\w./])([a-z_]+\.py|[a-z_]+/)(?![\w])", text)


def test_every_folder_of_the_code_has_a_row():
    rows = {folder for folder, _ in layout_rows()}
    folders = {path.parent.relative_to(REPO_ROOT).as_posix() for root in CODE_ROOTS
               for path in (REPO_ROOT / root).rglob("__init__.py")}
    # Sub-folders of a workload are described in its own row (vision/: sources/ → preprocess/ → …).
    described = {folder for folder in folders if folder.count("/") >= 2 and folder.startswith("workloads/")}
    assert sorted(folders - rows - described) == []


def test_every_file_and_folder_the_layout_names_exists():
    missing = []
    for folder, words in layout_rows():
        base = REPO_ROOT / folder
        assert base.is_dir(), f"{folder}/ is in the layout but not in the repository"
        for name in named_files(words):
            if not (base / name).exists() and not list(base.rglob(name.rstrip("/"))):
                missing.append(f"{folder}/{name}")
    assert missing == []
