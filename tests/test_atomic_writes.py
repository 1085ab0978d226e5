"""Replacing files and folders whole (``jobs.infra.atomic``), with the writing process killed for real."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from jobs.infra import atomic
from tests.support.cli import REPO_ROOT
from tests.support.waiting import HANG_GUARD_S, wait_for_condition


def _killed_while(script: str, ready: Path, directory: Path) -> None:
    """Run ``script`` in a process of its own; SIGKILL it once it has created ``ready``."""
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=directory,
                               env={"PYTHONPATH": str(REPO_ROOT)})
    try:
        wait_for_condition(lambda: ready.exists() or process.poll() is not None, timeout_s=HANG_GUARD_S,
                           interval_s=0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL, "the writer ended before it was killed"


def test_a_file_written_by_a_killed_process_keeps_its_old_content(tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text("old and whole")
    _killed_while(f"""
        import pathlib, time
        from jobs.infra import atomic
        def write(tmp):
            pathlib.Path(tmp).write_text("new but half")
            pathlib.Path({str(tmp_path / "ready")!r}).touch()
            time.sleep(300)
        atomic.replace_file(pathlib.Path({str(target)!r}), write)
    """, tmp_path / "ready", tmp_path)
    assert target.read_text() == "old and whole"


def test_a_folder_moved_aside_by_a_killed_process_is_put_back(tmp_path):
    final = tmp_path / "dataset"
    (final / "train").mkdir(parents=True)
    (final / "train" / "part-0.parquet").write_text("old rows")
    staged = tmp_path / "staged"
    staged.mkdir()
    # Killed between the two renames: the old folder aside, the new one not yet in its place.
    _killed_while(f"""
        import os, pathlib, time
        final = pathlib.Path({str(final)!r})
        aside = final.with_name(f".{{final.name}}.old-{{os.getpid()}}-0123abcd")
        os.replace(final, aside)
        pathlib.Path({str(tmp_path / "ready")!r}).touch()
        time.sleep(300)
    """, tmp_path / "ready", tmp_path)
    assert not final.exists()
    atomic.recover_dir(final)
    assert (final / "train" / "part-0.parquet").read_text() == "old rows"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "ready", "staged"]


def test_recovery_removes_dead_writers_folders_and_leaves_live_ones_alone(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f".out.tmp-{dead_pid}-aaaa0000").mkdir()
    (tmp_path / f".out.old-{dead_pid}-bbbb0000").mkdir()  # final exists: a stale copy, not a lost one
    live = atomic.staging_dir(final)
    live.mkdir()
    (tmp_path / ".out.notes").write_text("not ours")
    atomic.recover_dir(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.notes", live.name, "out"]
