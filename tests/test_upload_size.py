"""The working_dir size estimate counts what Ray would upload, and nothing it leaves out."""

from __future__ import annotations

from runner.client.submission import working_dir_size


def test_size_honours_excludes_and_gitignore(tmp_path):
    (tmp_path / "code.py").write_bytes(b"x" * 1000)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "pack").write_bytes(b"x" * 50_000)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"x" * 70_000)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "result.bin").write_bytes(b"x" * 30_000)
    (tmp_path / ".gitignore").write_text("out/\n")
    everything = working_dir_size(str(tmp_path), [".git"])
    assert everything == 1000 + 70_000 + len("out/\n")
    assert working_dir_size(str(tmp_path), [".git", "data/"]) == 1000 + len("out/\n")
