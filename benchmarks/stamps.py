"""Which code a benchmark table measured, and whether that code has changed since.

Every table that ``benchmarks/run_all.py`` writes ends with a line ``<!-- sources sha256:HEX -->``: a
hash of the content of the files its benchmark declares it measures (its scripts, and the packages
and specs they exercise). A figure quoted in prose elsewhere in the docs sits between
``<!-- figure:NAME.KEY sha256:HEX -->`` and ``<!-- /figure -->``, filled from the same run.
``run_all.py --check`` hashes the same files again and names every table and quoted figure whose
code has changed since it was measured. A commit alone cannot say that: tables measured with
uncommitted changes, or at a commit that was later rewritten, would look current.

Only the standard library is imported, so the check costs a few milliseconds and runs in the
fast tier of the tests.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

# What a benchmark's figures can depend on: code, and the specs and configs it reads.
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".toml", ".cfg", ".txt")
DIGEST_HEX_CHARS = 16  # 64 bits: enough to tell two versions of the code apart, short enough to read

TABLE = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->\n(?P<body>.*?)\n<!-- /bench:(?P=name) -->", re.S)
TABLE_STAMP = re.compile(r"<!-- sources sha256:(?P<digest>[0-9a-f]+) -->")
# A marker quoted in a code span (`<!-- figure:… -->`) is documentation of the syntax, not a figure.
FIGURE = re.compile(r"(?<!`)<!-- figure:(?P<name>[\w-]+)\.(?P<key>[^ >]+?)(?: sha256:(?P<digest>[0-9a-f]+))? -->"
                    r"(?P<text>.*?)<!-- /figure -->", re.S)
# How a table from a --quick run begins its stamp line: its figures mean nothing, whatever its hash says.
QUICK_RUN_LEAD = "**Quick run**"
COMMIT = re.compile(r"at commit `(?P<commit>[0-9a-f]{7,40})`")


def source_files(root: Path, declared: Iterable[str]) -> list[Path]:
    """The files behind ``declared`` (paths relative to ``root``: files, or folders taken whole), sorted."""
    found: set[Path] = set()
    for entry in declared:
        path = root / entry
        if path.is_dir():
            found.update(file for file in path.rglob("*") if file.is_file() and file.suffix in SOURCE_SUFFIXES
                         and "__pycache__" not in file.parts)
        elif path.is_file():
            found.add(path)
    return sorted(found, key=lambda file: file.relative_to(root).as_posix())


def sources_digest(root: Path, declared: Iterable[str]) -> str:
    """A hash of the names and contents of the files behind ``declared``.

    A declared path that does not exist enters the hash by name, so a file that goes away changes it too.
    """
    declared = sorted(set(declared))
    digest = hashlib.sha256()
    for entry in declared:
        if not (root / entry).exists():
            digest.update(f"missing {entry}\n".encode())
    for file in source_files(root, declared):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()[:DIGEST_HEX_CHARS]


def table_stamp(digest: str) -> str:
    """The line that closes a generated table: the hash of the code it measured."""
    return f"<!-- sources sha256:{digest} -->"


def quote_figure(figure: Mapping[str, Any]) -> str:
    """A figure of a result (its median) as prose quotes it: ``1.05×``, ``139.9 images/s``, ``0.427``."""
    median, unit = float(figure["median"]), figure.get("unit", "")
    if unit == "x":
        return f"{median:.2f}×"
    if unit in ("accuracy", ""):
        return f"{median:.3f}"
    return f"{median:.1f} {unit}" if median >= 10 else f"{median:.2f} {unit}"


def fill_figures(text: str, results: Mapping[str, list[dict]]) -> tuple[str, list[str]]:
    """Fill every ``<!-- figure:NAME.KEY -->`` block of ``text`` whose benchmark is in ``results``.

    ``results`` maps a benchmark's name to its runs' results; the first run holding KEY gives the figure.
    Returns the new text and the blocks whose KEY no result holds (left as they were).
    """
    unknown: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name, key = match["name"], match["key"]
        if name not in results:
            return match[0]
        for result in results[name]:
            if key in result.get("figures", {}) and result.get("sources_sha256"):
                return (f"<!-- figure:{name}.{key} sha256:{result['sources_sha256']} -->"
                        f"{quote_figure(result['figures'][key])}<!-- /figure -->")
        unknown.append(f"{name}.{key}")
        return match[0]

    return FIGURE.sub(fill, text), unknown


@dataclass(frozen=True)
class Finding:
    """What ``--check`` found about one table or quoted figure."""

    where: str  # "docs/benchmarks.md: table cli_latency", "README.md: figure cli_latency.ratio"
    state: str  # "fresh", "stale", "unstamped", "quick", "missing" or "unknown"
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the figure is known to come from the code as it is now."""
        return self.state == "fresh"


def check_tables(text: str, label: str, current: Mapping[str, str], skipped: Collection[str] = ()) -> list[Finding]:
    """Every declared benchmark's table in ``text`` (a docs file named ``label``) against ``current`` hashes.

    Tables of the benchmarks in ``skipped`` (known, but not asked about) are passed over.
    """
    tables = {match["name"]: match["body"] for match in TABLE.finditer(text)}
    findings = []
    for name, digest in current.items():
        where = f"{label}: table {name}"
        if name not in tables:
            findings.append(Finding(where, "missing", f"no <!-- bench:{name} --> block"))
            continue
        stamp = TABLE_STAMP.search(tables[name])
        if QUICK_RUN_LEAD in tables[name]:
            findings.append(Finding(where, "quick", "a --quick run's table: its figures mean nothing"))
        elif stamp is None:
            findings.append(Finding(where, "unstamped", "measured before tables carried the hash of their code"))
        elif stamp["digest"] != digest:
            findings.append(Finding(where, "stale", f"measured code sha256:{stamp['digest']}, now {digest}"))
        else:
            findings.append(Finding(where, "fresh"))
    findings += [Finding(f"{label}: table {name}", "unknown", "no benchmark of that name")
                 for name in tables if name not in current and name not in skipped]
    return findings


def check_figures(text: str, label: str, current: Mapping[str, str], skipped: Collection[str] = ()) -> list[Finding]:
    """Every quoted figure in ``text`` (a docs file named ``label``) against ``current`` hashes, but those of
    the benchmarks in ``skipped``."""
    findings = []
    for match in FIGURE.finditer(text):
        if match["name"] in skipped:
            continue
        where = f"{label}: figure {match['name']}.{match['key']}"
        digest = current.get(match["name"])
        if digest is None:
            findings.append(Finding(where, "unknown", "no benchmark of that name"))
        elif not match["digest"]:
            findings.append(Finding(where, "unstamped", "not yet filled by run_all.py"))
        elif match["digest"] != digest:
            findings.append(Finding(where, "stale", f"measured code sha256:{match['digest']}, now {digest}"))
        else:
            findings.append(Finding(where, "fresh"))
    return findings


def stamped_commits(text: str) -> list[str]:
    """The commits the tables of ``text`` say they were measured at, in order of first mention."""
    return list(dict.fromkeys(match["commit"] for match in COMMIT.finditer(text)))


def commits_not_in_history(root: Path, commits: Iterable[str]) -> list[str]:
    """Of ``commits``, those this checkout's history does not hold (none when git cannot be asked)."""
    commits = list(commits)
    if not commits:
        return []
    try:
        # One process for every commit: cat-file answers "missing" per line instead of failing.
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(root), "cat-file", "--batch-check"],
                              input="".join(f"{commit}^{{commit}}\n" for commit in commits), capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    answers = done.stdout.splitlines()
    return [commit for commit, answer in zip(commits, answers) if answer.endswith("missing")]


def figure_docs(root: Path, entries: Sequence[str]) -> list[Path]:
    """The Markdown files named by ``entries`` (files, or folders whose ``*.md`` count), relative to ``root``."""
    found: list[Path] = []
    for entry in entries:
        path = root / entry
        found += sorted(path.glob("*.md")) if path.is_dir() else [path] if path.is_file() else []
    return found


def fill_quoted_figures(root: Path, entries: Sequence[str], measured: Mapping[str, list[dict]]) -> None:
    """Fill the ``<!-- figure:NAME.KEY -->`` blocks of the docs in ``entries`` from the results just measured."""
    for path in figure_docs(root, entries):
        text = path.read_text(encoding="utf-8")
        filled, unknown = fill_figures(text, measured)
        for where in unknown:
            print(f"{path.relative_to(root)}: no figure {where} in the results: left as it was")
        if filled != text:
            path.write_text(filled, encoding="utf-8")
            print(f"filled the quoted figures of {path.relative_to(root)}")


def check_docs(docs: Path, root: Path, current: Mapping[str, str], entries: Sequence[str],
               skipped: Collection[str] = ()) -> int:
    """``run_all.py --check``: the tables of ``docs`` and the figures quoted in ``entries`` against ``current``.

    ``current`` maps each benchmark asked about to the hash of its code now; ``skipped`` names the other
    benchmarks, whose tables and figures are passed over. Prints one line per table and figure;
    returns 1 when one was measured on other code, carries no hash or is missing, else 0. A stamp that
    names a commit outside this checkout's history is said, but only the hash decides.
    """
    label = docs.relative_to(root).as_posix() if docs.is_relative_to(root) else str(docs)
    text = docs.read_text(encoding="utf-8")
    findings = check_tables(text, label, current, skipped)
    for path in figure_docs(root, entries):
        if path.resolve() != docs.resolve():
            findings += check_figures(path.read_text(encoding="utf-8"), path.relative_to(root).as_posix(), current,
                                      skipped)
    findings += check_figures(text, label, current, skipped)
    for finding in findings:
        print(f"{finding.state:9s} {finding.where}" + (f": {finding.detail}" if finding.detail else ""))
    commits = stamped_commits(text)
    if len(commits) > 1:
        print(f"note: the tables name {len(commits)} commits ({', '.join(commits)}): they come from several runs")
    for commit in commits_not_in_history(root, commits):
        print(f"note: commit {commit}, named by a stamp, is not in this checkout's history")
    outdated = sorted({finding.where.rsplit(" ", 1)[-1].split(".")[0] for finding in findings if not finding.ok})
    print(f"{len(findings) - sum(not f.ok for f in findings)} of {len(findings)} up to date")
    if outdated:
        print(f"to measure them again: benchmarks/run_all.py --only {' '.join(outdated)}")
    return 1 if outdated else 0
