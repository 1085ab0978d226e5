"""Reference data kept beside the project (``../shared``): present in CI, absent on a user's machine.

Tests that use it skip with :func:`skip_unless_present`'s reason when it is missing; nothing the README
promises depends on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import REPO_ROOT

SHARED_DIR = REPO_ROOT.parent / "shared"
# 96 real Food-101 photos at 512 px, 6 classes, official layout.
FOOD101_SAMPLE = SHARED_DIR / "data" / "food101-sample"
# 3500 real Food-101 photos at 64 px, 10 classes (3000 train / 500 test), official layout.
FOOD101_64PX_DEV = SHARED_DIR / "data" / "food101-64px-dev"


def skip_unless_present(path: Path, what: str) -> pytest.MarkDecorator:
    """A skip marker, with the reason stated, for a test that needs ``path``."""
    return pytest.mark.skipif(not path.is_dir(), reason=f"{what} is not at {path} (it is not shipped with the project)")
