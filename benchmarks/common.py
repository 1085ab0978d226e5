"""What every benchmark shares: a private Ray instance, alternating rounds with a warm-up, medians with
their spread, the stamp of where and when a figure was measured, and the JSON result that
``benchmarks/run_all.py`` turns into the tables of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def add_training_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """``--epochs``, ``--rounds`` and ``--set``: the options of a benchmark that times quickstart training."""
    parser.add_argument("--epochs", type=int, default=4, help="Epochs per run (the first is not timed).")
    parser.add_argument("--rounds", type=int, default=rounds, help="Runs of each side, alternating.")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="a further spec override for both sides (e.g. workload.data.synthetic_per_class=40)")


def timed_training(tag: str, scratch: Path, epochs: int) -> list[str]:
    """The quickstart's settings for a run long enough to time: preprocess and train only, 64 px, 2 workers × 1 CPU."""
    return ["workload.stages=[preprocess, train]", f"workload.run_name={tag}",
            f"workload.storage_path={scratch / 'results'}", f"workload.data.output_dir={scratch / 'data'}",
            "workload.data.image_size=64", f"workload.train.epochs={epochs}", "workload.train.num_workers=2",
            "workload.train.cpus_per_worker=1"]


def submit_spec(spec: str, cluster: str, settings: list[str], tag: str,
                timeout_s: float = 1800) -> tuple[subprocess.CompletedProcess[str], float]:
    """``rayjobs submit SPEC --cluster CLUSTER --set …`` from the project, followed to its end.

    Returns the finished command and its wall time in seconds (what a user waits for); a run that
    does not succeed ends the benchmark, naming ``tag`` and the end of its output.
    """
    command = [sys.executable, "-m", "runner.cli.app", "submit", spec, "--cluster", cluster]
    for setting in settings:
        command += ["--set", setting]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tag}: rayjobs submit exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done, seconds


def mean_images_per_s(run_dir: Path) -> float:
    """The mean ``images_per_s`` of a run's epochs after the first (which includes start-up), from its metrics.csv."""
    from workloads.ray_train.metrics import read_metrics_csv

    rows = read_metrics_csv(run_dir / "metrics.csv")
    timed = [row["images_per_s"] for row in rows[1:]] or [rows[-1]["images_per_s"]]
    return sum(timed) / len(timed)


def quickstart_sides(name: str, sides: dict[str, Callable[[str, Path, str, int], tuple]], rounds: int, epochs: int,
                     prepare: Callable[[Path], None] | None = None) -> dict[str, list[tuple]]:
    """Run quickstart training sides on one private 2-CPU local cluster, alternating, each warmed up once.

    ``sides[label](cluster, scratch, tag, epochs)`` trains once as run ``tag`` under ``scratch`` and returns
    ``(images/s, wall seconds, ...)``; the warm-up runs one epoch (and writes the dataset the rest reuse).
    ``prepare(scratch)`` runs before the cluster starts. Returns each side's results, round by round.
    """
    import tempfile

    from runner import local

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    with tempfile.TemporaryDirectory(prefix=f"rayjobs-bench-{name}-") as scratch_dir:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        if prepare is not None:
            prepare(scratch)
        cluster = local.start(name=f"bench-{name}", num_cpus=2)
        runs = iter(range(1_000))

        def side(label: str, side_epochs: int) -> Callable[[], tuple]:
            def run() -> tuple:
                result = sides[label](cluster.name, scratch, f"run{next(runs)}", side_epochs)
                print(f"{label:34s} {result[0]:7.1f} images/s  {result[1]:6.1f} s", flush=True)
                return result

            return run

        try:
            return alternate({label: side(label, epochs) for label in sides}, rounds,
                             warmup={label: side(label, 1) for label in sides})
        finally:
            local.stop(cluster.name)


def images_and_wall(result: "Result", labels: tuple[str, str], results: dict[str, list[tuple]],
                    keys: tuple[str, str], goal: str, args: argparse.Namespace, wall_goal: str = "") -> None:
    """Fill ``result`` with one row per round of two sides of :func:`quickstart_sides` (images/s and wall
    seconds, baseline first), their medians and the note on how they were run; print the medians."""
    base_label, other_label = labels
    base, other = ([entry[0] for entry in results[label]] for label in labels)
    base_s, other_s = ([entry[1] for entry in results[label]] for label in labels)
    for index in range(len(base)):
        result.rows.append([str(index + 1), f"{base[index]:.1f} images/s, {base_s[index]:.1f} s",
                            f"{other[index]:.1f} images/s, {other_s[index]:.1f} s",
                            f"{other[index] / base[index]:.3f}×", f"{other_s[index] / base_s[index]:.3f}×"])
    baseline = result.figure(f"{keys[0]}_images_per_s", Spread.of(base), "images/s")
    shipped = result.figure(f"{keys[1]}_images_per_s", Spread.of(other), "images/s")
    ratio = result.figure("ratio", Spread.ratio(other, base), "x")
    wall = result.figure("wall_ratio", Spread.ratio(other_s, base_s), "x")
    result.rows.append(["median", baseline.text(1), shipped.text(1), ratio.times(3) + f" ({goal})",
                        wall.times(3) + (f" ({wall_goal})" if wall_goal else "")])
    settings = f" (with {', '.join(args.overrides)})" if args.overrides else ""
    result.notes.append(f"The quickstart{settings} at 64 px, preprocess and train, {args.epochs} epochs per run, the "
                        f"mean images/s of epochs 2–{args.epochs}; {plural(args.rounds, 'round')} after a one-epoch "
                        "warm-up of each side, on one 2-CPU local cluster.")
    width = max(map(len, labels)) + 1
    print(f"\n{base_label + ':':{width}} {baseline.text()} images/s")
    print(f"{other_label + ':':{width}} {shipped.text()} images/s")
    print(f"ratio ({other_label} / {base_label}): {ratio.text(3)}x; wall time {wall.text(3)}x")


def start_private_ray(num_cpus: int, log_to_driver: bool = False, dashboard: bool = False) -> None:
    """Start a Ray instance of ``num_cpus`` CPUs for this process alone, on loopback.

    ``address="local"`` ignores any RAY_ADDRESS (a benchmark never joins a user's
    cluster); token auth is off so that Ray does not write ~/.ray/auth_token. ``dashboard``
    starts Ray's dashboard too, whose state API Ray Train's placement-group cleaner needs to
    free the workers of a trainer killed mid-run (a sweep's trial that ASHA stops).
    """
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts its workers at nice 15. Every baseline here runs at nice 0, so on a machine
    # shared with other work the Ray side would lose CPU to the neighbours that the baseline
    # keeps: the ratio would measure the scheduler, not the code.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1",
             log_to_driver=log_to_driver)


# --------------------------------------------------------------------------- rounds and spreads


def alternate(sides: dict[str, Callable[[], T]], rounds: int, warmup: bool | dict[str, Callable[[], Any]] = True,
              show: Callable[[int, dict[str, T]], None] | None = None) -> dict[str, list[T]]:
    """Run every side once to warm up (results dropped), then ``rounds`` rounds of all sides.

    The order reverses every other round, so a side is not always the one that meets the
    machine just after the other (warm caches, a neighbour's load that builds up). ``warmup``
    may give lighter callables per side; ``show(round, results)`` prints a round's figures.
    """
    names = list(sides)
    if warmup:
        for name in reversed(names):  # the reverse of round 1's order: neither side starts round 1 cold
            run = warmup[name] if isinstance(warmup, dict) else sides[name]
            print(f"  warm-up: {name}", flush=True)
            run()
    results: dict[str, list[T]] = {name: [] for name in names}
    for index in range(rounds):
        for name in (names if index % 2 == 0 else names[::-1]):
            results[name].append(sides[name]())
        if show is not None:
            show(index, {name: values[-1] for name, values in results.items()})
    return results


@dataclass
class Spread:
    """A figure over rounds: the median, and the lowest and highest round."""

    median: float
    low: float
    high: float
    values: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, values: list[float]) -> "Spread":
        """The spread of ``values`` (at least one)."""
        return cls(statistics.median(values), min(values), max(values), list(values))

    @classmethod
    def ratio(cls, ours: list[float], baseline: list[float]) -> "Spread":
        """Round-by-round ratios ``ours / baseline``: the two sides of one round met the same machine."""
        return cls.of([a / b for a, b in zip(ours, baseline, strict=True)])

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``82.1 images/s (54.9–90.0)``; no bracket for a single round."""
        body = f"{self.median:.{digits}f}{unit}"
        if len(self.values) > 1:
            body += f" ({self.low:.{digits}f}–{self.high:.{digits}f})"
        return body

    def times(self, digits: int = 2) -> str:
        """A ratio: ``**0.97×** (0.91–1.03)``."""
        body = f"**{self.median:.{digits}f}×**"
        if len(self.values) > 1:
            body += f" ({self.low:.{digits}f}–{self.high:.{digits}f})"
        return body


def plural(count: int, word: str) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


# --------------------------------------------------------------------------- stamp


def git_revision() -> tuple[str, bool]:
    """This checkout's short commit hash, and whether tracked or new files differ from it."""
    def git(*args: str) -> str:
        # --no-optional-locks: only read; never refresh the index under another git command.
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO_ROOT), *args], capture_output=True,
                              text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit, bool(git("status", "--porcelain"))


def software_versions() -> str:
    """``Python 3.11.9, ray 2.60.0, torch 2.14.1``: read from the installed metadata, nothing imported."""
    from importlib import metadata

    found = [f"Python {sys.version.split()[0]}"]
    for package in ("ray", "torch"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


@dataclass
class Stamp:
    """Where and when a figure was measured."""

    commit: str
    dirty: bool
    date: str  # UTC, minutes
    cores: int
    load_before: float  # 1-minute load average
    load_after: float | None = None
    software: str = ""

    @classmethod
    def begin(cls) -> "Stamp":
        """The stamp of a measurement that starts now."""
        commit, dirty = git_revision()
        now = datetime.datetime.now(datetime.timezone.utc)
        return cls(commit, dirty, now.strftime("%Y-%m-%d %H:%M UTC"), os.cpu_count() or 0, os.getloadavg()[0],
                   software=software_versions())

    def end(self) -> "Stamp":
        """Record the load average once the measurement is over."""
        self.load_after = os.getloadavg()[0]
        return self

    def line(self) -> str:
        """One sentence: commit, date, cores, load average."""
        commit = f"`{self.commit}`" + (" with uncommitted changes" if self.dirty else "")
        after = f", {self.load_after:.2f} after" if self.load_after is not None else ""
        software = f"; {self.software}" if self.software else ""
        return (f"commit {commit}, {self.date}, {self.cores} cores, "
                f"load average {self.load_before:.2f} before{after}{software}")


# --------------------------------------------------------------------------- results


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json PATH``: where the benchmark writes its machine-readable result."""
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the result as JSON to PATH (run_all.py reads it)")


def command_line() -> str:
    """This benchmark's command line, as a reader would type it from the project root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(REPO_ROOT)
    except ValueError:
        pass
    arguments = []
    skip = False
    for argument in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if argument == "--json":  # where the result goes is no part of what was measured
            skip = True
            continue
        if argument.startswith("--json="):
            continue
        arguments.append(argument)
    return " ".join([str(script), *arguments])


@dataclass
class Result:
    """One benchmark's figures: a table for the docs, the raw figures, and the stamp."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    stamp: Stamp
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    command: str = field(default_factory=command_line)

    def figure(self, key: str, spread: Spread, unit: str) -> Spread:
        """Keep ``spread`` under ``key`` (rounds included) for the JSON result; return it."""
        self.figures[key] = {"unit": unit, **asdict(spread)}
        return spread

    def save(self, path: Path | None) -> None:
        """Write the result as JSON to ``path`` (nothing when ``path`` is None)."""
        if path is None:
            return
        if self.stamp.load_after is None:
            self.stamp.end()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def timed_command(command: list[str], expected_code: int = 0, env: dict[str, str] | None = None,
                  cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of one run of ``command`` as a new process, and its result; exits unless it ended with
    ``expected_code``."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if done.returncode != expected_code:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}, not {expected_code}:\n{done.stderr[-2000:]}")
    return elapsed, done
