"""Run every benchmark and rewrite its table in docs/benchmarks.md.

    python benchmarks/run_all.py [--quick] [--only NAME ...] [--no-write] [--write-quick] [--results DIR]
    python benchmarks/run_all.py --render DIR      # rewrite the tables from an earlier run's JSON results
    python benchmarks/run_all.py --check           # which tables and quoted figures the code has outgrown

Each benchmark runs as a subprocess with ``--json PATH`` and leaves its result there; the
table between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in docs/benchmarks.md is
then replaced by the new one, with the commit, date, cores and load average it was measured
at, and the hash of the code it measured (``benchmarks/stamps.py``). A figure quoted in prose
(``<!-- figure:NAME.KEY -->…<!-- /figure -->`` in the README and docs/) is filled from the
same results. The prose around the markers is left as it is. A benchmark that fails or is
skipped keeps its old table.

``--quick`` runs every benchmark at tiny sizes, one round: it proves that each one still runs
and writes its result, and its figures mean nothing. So it writes no tables unless
``--write-quick`` asks (they are then marked as quick runs, to be replaced by a full run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import Stamp, command_line, markdown_table  # noqa: E402
from benchmarks.stamps import (QUICK_RUN_LEAD, check_docs, fill_quoted_figures, sources_digest,  # noqa: E402
                               table_stamp)

DOCS = REPO_ROOT / "docs" / "benchmarks.md"
# Where prose may quote a benchmark's figure between <!-- figure:NAME.KEY --> markers.
FIGURE_DOCS = ("README.md", "docs")
LEARNING_DATA = REPO_ROOT.parent / "shared" / "data" / "food101-64px-dev"


@dataclass
class Run:
    """One invocation of a benchmark script: its arguments for a full run, and for ``--quick`` (None: not run)."""

    script: str
    full: list[str] = field(default_factory=list)
    quick: list[str] | None = None
    timeout_s: float = 3600


@dataclass
class Benchmark:
    """One table of docs/benchmarks.md and the runs whose rows fill it."""

    name: str
    runs: list[Run]
    minutes: float  # a full run's duration on 2 idle cores, estimated from its sizes, for --list
    # What the figures depend on besides the scripts run and benchmarks/common.py: files or whole folders,
    # relative to the project root. A change to any of them makes the table stale (--check).
    measures: tuple[str, ...] = ()

    def sources(self) -> list[str]:
        """Every path whose content the table's figures depend on."""
        scripts = [f"benchmarks/{run.script}" for run in self.runs]
        return sorted({*scripts, "benchmarks/common.py", *self.measures})

    def digest(self, root: Path = REPO_ROOT) -> str:
        """The hash of the content of :meth:`sources` as they are now."""
        return sources_digest(root, self.sources())

    def missing(self) -> str | None:
        """Why this benchmark cannot run on this machine, or None."""
        on_real_photos = ("learning_quality", "sweep_real_photos", "sweep_asha")
        if self.name in on_real_photos and not (LEARNING_DATA / "meta" / "classes.txt").is_file():
            return (f"needs the 64 px Food-101 dev set and its reference script at {LEARNING_DATA}, "
                    "which is kept outside the project")
        return None


# The client, and what it ships with every job (the run record's keeper, the progress callback).
CLIENT = ("jobs", "runner", "rayjobs_agent")
# A quickstart submitted with `rayjobs submit` and followed: every package takes part.
QUICKSTART_END_TO_END = ("jobs", "runner", "rayjobs_agent", "workloads", "specs/quickstart.yaml")
# The quickstart-based benchmarks of a full run: 60 generated images per class instead of 120, so that every
# benchmark fits one sitting on 2 cores.
QUICKSTART_FULL_SIZE = ["--set", "workload.data.synthetic_per_class=60"]

BENCHMARKS = [
    Benchmark("cli_latency", [Run("cli_latency.py", ["--runs", "5"], ["--runs", "1"])], 2, CLIENT),
    Benchmark("refusal_latency", [Run("refusal_latency.py", ["--rounds", "5"], ["--rounds", "1"])], 1,
              ("jobs", "runner", "tests/corpus/specs")),
    Benchmark("preprocess_throughput", [
        Run("preprocess_throughput.py", ["--runs", "3", "--images", "1200"], ["--runs", "1", "--images", "60"]),
    ], 2, ("workloads", "tests/support/images.py")),
    Benchmark("train_throughput", [
        Run("train_throughput.py", ["--rounds", "2"], ["--rounds", "1", "--images", "64", "--size", "32", "--batch", "16"]),
    ], 5, ("workloads", "benchmarks/plain_torch.py")),
    Benchmark("training_vs_bare_step", [
        Run("training_vs_bare_step.py", ["--rounds", "2"],
            ["--rounds", "1", "--images", "128", "--size", "32", "--batch", "8", "--units", "1", "--epochs", "2"]),
    ], 9, ("workloads", "benchmarks/train_throughput.py", "benchmarks/plain_torch.py", "benchmarks/precision.py",
           "benchmarks/learning_quality.py")),
    Benchmark("inference_throughput", [
        # 64 px, where start-up weighs most.
        Run("inference_throughput.py", ["--size", "64"],
            ["--rounds", "1", "--images", "300", "--task-images", "4", "--size", "32"]),
    ], 4, ("workloads", "benchmarks/train_throughput.py", "benchmarks/plain_torch.py")),
    Benchmark("startup_breakdown", [
        Run("startup_breakdown.py", ["--rounds", "2"],
            ["--rounds", "1", "--train-images", "64", "--infer-images", "300"]),
    ], 3, ("workloads", "benchmarks/train_throughput.py", "benchmarks/inference_throughput.py",
           "benchmarks/plain_torch.py")),
    Benchmark("ingest_throughput", [
        Run("ingest_throughput.py", ["--rounds", "2", "--images", "1024"],
            ["--rounds", "1", "--images", "128", "--size", "32", "--epochs", "2"]),
    ], 5, ("workloads", "benchmarks/train_throughput.py", "benchmarks/plain_torch.py")),
    Benchmark("learning_quality", [
        Run("learning_quality.py", ["--seeds", "0"], ["--seeds", "0", "--epochs", "2"], timeout_s=3 * 3600),
    ], 11, ("jobs", "workloads", "specs/food101.yaml")),
    Benchmark("precision", [
        # The recipe's part trains in both precisions: what `amp: auto` may pick depends on its accuracy as much
        # as its speed. One seed here keeps a full run within a sitting; `--seeds 0 1 2` gives the spread. On a CPU without bf16 instructions the emulated bf16 runs train
        # about ten times slower than fp32; there, add --skip-recipe to measure the bare step only.
        Run("precision.py", ["--rounds", "2", "--steps", "6", "--seeds", "0"], ["--rounds", "1", "--sizes", "32", "--steps", "2", "--batch", "4", "--skip-recipe"],
            timeout_s=2 * 3600),
    ], 40, ("jobs", "workloads", "specs/food101.yaml", "benchmarks/learning_quality.py", "benchmarks/plain_torch.py")),
    Benchmark("multinode_training", [
        Run("multinode_training.py", ["--rounds", "2", "--epochs", "2", *QUICKSTART_FULL_SIZE],
            ["--rounds", "1", "--epochs", "2", "--set", "workload.data.synthetic_per_class=20"]),
    ], 6, QUICKSTART_END_TO_END),
    Benchmark("quickstart_s3", [
        Run("quickstart_s3.py", ["--rounds", "2", *QUICKSTART_FULL_SIZE],
            ["--rounds", "1", "--set", "workload.train.epochs=1", "--set", "workload.data.synthetic_per_class=20"]),
    ], 6, (*QUICKSTART_END_TO_END, "tests/support/s3_server.py")),
    Benchmark("progress_overhead", [
        Run("progress_overhead.py", ["--rounds", "2", "--epochs", "2", *QUICKSTART_FULL_SIZE],
            ["--rounds", "1", "--epochs", "2", "--set", "workload.data.synthetic_per_class=16"]),
    ], 8, QUICKSTART_END_TO_END),
    Benchmark("sweep_overhead", [
        Run("sweep_overhead.py", ["--rounds", "2", "--epochs", "2", *QUICKSTART_FULL_SIZE],
            ["--rounds", "1", "--epochs", "2", "--set", "workload.data.synthetic_per_class=16"]),
    ], 7, QUICKSTART_END_TO_END),
    Benchmark("sweep_real_photos", [
        Run("sweep_real_photos.py", ["--image-size", "32", "--epochs", "3", "--trials", "3"],
            ["--epochs", "1", "--trials", "2", "--image-size", "24"], timeout_s=3600),
    ], 8, ("jobs", "workloads", "specs/food101.yaml", "benchmarks/learning_quality.py")),
    Benchmark("sweep_asha", [
        Run("sweep_asha.py", ["--epochs", "4", "--trials", "3"], ["--epochs", "2", "--trials", "2", "--image-size", "24"], timeout_s=3600),
    ], 7, ("jobs", "workloads", "specs/food101.yaml", "benchmarks/learning_quality.py",
            "benchmarks/sweep_real_photos.py")),
    Benchmark("queue_admission", [
        Run("queue_admission.py", ["--rounds", "2", "--waiting", "100"], ["--rounds", "1", "--waiting", "4"]),
    ], 9, CLIENT),
    Benchmark("pipeline_submission", [
        Run("pipeline_submission.py", ["--rounds", "2", "--jobs", "10", "--waiting", "200"],
            ["--rounds", "1", "--jobs", "3", "--waiting", "5"]),
    ], 4, (*CLIENT, "benchmarks/queue_admission.py")),
    Benchmark("follower_events", [
        # 500 events in 75 s: twelve times the rate of 2,000 events over a 30-minute run.
        Run("follower_events.py", ["--events", "500", "--seconds", "75"], ["--events", "50", "--seconds", "5"]),
    ], 3, CLIENT),
    Benchmark("runs_listing", [
        Run("runs_listing.py", ["--rounds", "3"], ["--rounds", "1", "--local", "20", "--s3", "10"]),
    ], 2, ("jobs", "runner", "tests/support/s3_server.py")),
    Benchmark("long_log", [
        Run("long_log.py", ["--rounds", "2", "--megabytes", "30", "--seconds", "30"],
            ["--rounds", "1", "--megabytes", "4", "--seconds", "8", "--warmup-megabytes", "0.5"]),
    ], 4, (*CLIENT, "tests/support/fault_proxy.py")),
]


# --------------------------------------------------------------------------- running


CLI_LINE = re.compile(r"^(rayjobs [\w-]+)\s+median ([\d.]+)s \| (ray job [\w-]+)\s+median ([\d.]+)s \| ratio ([\d.]+)x "
                      r"\(target <= ([\d.]+)x\)", re.MULTILINE)
CLI_SPREAD = re.compile(r"^\s*spread \(min-max of \d+\): (rayjobs [\w-]+) ([\d.]+)-([\d.]+)s, (ray job [\w-]+) "
                        r"([\d.]+)-([\d.]+)s", re.MULTILINE)


def result_from_cli_output(output: str, stamp: Stamp, command: str) -> dict:
    """A result for a benchmark that prints its figures but writes no JSON (cli_latency.py without ``--json``)."""
    spreads = {}
    for ours, ours_low, ours_high, theirs, theirs_low, theirs_high in CLI_SPREAD.findall(output):
        if (ours_low, theirs_low) != (ours_high, theirs_high):  # a single run has no spread
            spreads[ours] = f" ({float(ours_low):.2f}–{float(ours_high):.2f})"
            spreads[theirs] = f" ({float(theirs_low):.2f}–{float(theirs_high):.2f})"
    rows = [[f"`{ours} …`", f"{float(ours_s):.2f} s{spreads.get(ours, '')}", f"`{theirs} …`",
             f"{float(theirs_s):.2f} s{spreads.get(theirs, '')}", f"**{float(ratio):.2f}×**", f"≤ {target}×"]
            for ours, ours_s, theirs, theirs_s, ratio, target in CLI_LINE.findall(output)]
    if not rows:
        raise RuntimeError("no 'median … ratio' lines in the output")
    return {"name": "cli_latency", "title": "CLI latency",
            "columns": ["command", "median", "baseline", "median", "ratio of the medians", "target"],
            "rows": rows, "stamp": vars(stamp.end()), "figures": {},
            "notes": [line.strip() for line in output.splitlines() if line.startswith("trip (")], "command": command}


def run_one(run: Run, arguments: list[str], json_path: Path) -> dict:
    """Run one benchmark script, its output streamed through; return its result."""
    script = REPO_ROOT / "benchmarks" / run.script
    writes_json = "add_json_option" in script.read_text(encoding="utf-8")
    command = [sys.executable, str(script), *arguments] + (["--json", str(json_path)] if writes_json else [])
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    stamp = Stamp.begin()
    output: list[str] = []
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, errors="replace")
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        process.send_signal(signal.SIGINT)

    # SIGINT first: the benchmark's finally blocks then stop the clusters it started.
    timers = [threading.Timer(run.timeout_s, stop), threading.Timer(run.timeout_s + 120, process.kill)]
    for timer in timers:
        timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            print(f"  {line}", end="", flush=True)
            output.append(line)
        returncode = process.wait()
    finally:
        for timer in timers:
            timer.cancel()
    if returncode != 0:
        raise RuntimeError(f"exited {returncode}" + (f" (stopped after {run.timeout_s:.0f} s)" if stopped.is_set()
                                                     else ""))
    if writes_json:
        return json.loads(json_path.read_text(encoding="utf-8"))
    result = result_from_cli_output("".join(output), stamp, " ".join([f"benchmarks/{run.script}", *arguments]))
    json_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return result


# --------------------------------------------------------------------------- docs


def stamp_line(result: dict) -> str:
    """Which command measured a result, at which commit, when, on how many cores, under what load."""
    known = {f.name for f in fields(Stamp)}  # results written by older or newer code still render
    stamp = Stamp(**{key: value for key, value in result["stamp"].items() if key in known})
    return f"`{result['command']}` at {stamp.line()}."


def render(results: list[dict]) -> str:
    """The generated block of one benchmark: the table, its notes, a stamp per run, and the hash of the code measured.

    The hash is left out when a result lacks it (written before results carried one) or when the runs
    measured different code (a file changed between them): ``--check`` then calls the table unstamped.
    """
    rows = [row for result in results for row in result["rows"]]
    parts = [markdown_table(results[0]["columns"], rows)]
    notes = [note for result in results for note in result.get("notes", [])]
    if notes:
        parts.append("\n".join(f"- {note}" for note in notes))
    stamps = [stamp_line(result) for result in results]
    lead = "Measured with"
    if any(result.get("quick") for result in results):
        lead = (f"{QUICK_RUN_LEAD} (tiny sizes, one round: it checks the harness, and its figures mean nothing), "
                "measured with")
    parts.append(f"{lead} {stamps[0]}" if len(stamps) == 1 else f"{lead}:\n" + "\n".join(f"- {s}" for s in stamps))
    digests = {result.get("sources_sha256") for result in results}
    block = "\n\n".join(parts)
    if len(digests) == 1 and None not in digests:
        block += "\n" + table_stamp(digests.pop())
    return block


def write_sections(docs: Path, blocks: dict[str, str]) -> list[str]:
    """Replace each ``<!-- bench:NAME -->`` … ``<!-- /bench:NAME -->`` block; return the names without markers."""
    text = docs.read_text(encoding="utf-8")
    missing = []
    for name, block in blocks.items():
        pattern = re.compile(rf"(<!-- bench:{re.escape(name)} -->\n).*?(\n<!-- /bench:{re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            missing.append(name)
            continue
        text = pattern.sub(lambda match: match.group(1) + block + match.group(2), text, count=1)
    docs.write_text(text, encoding="utf-8")
    return missing


def load_results(directory: Path, benchmark: Benchmark) -> list[dict] | None:
    """The saved results of every run of ``benchmark`` in ``directory``, or None when one is missing."""
    paths = [directory / f"{benchmark.name}-{index}.json" for index in range(len(benchmark.runs))]
    if not all(path.is_file() for path in paths):
        quick = [directory / f"{benchmark.name}-0.json"]  # a quick run has one run per benchmark
        if not quick[0].is_file():
            return None
        paths = quick
    return [json.loads(path.read_text(encoding="utf-8")) for path in paths]


# The packages whose bytecode is compiled before a run, as an install compiles it.
PRODUCT_PACKAGES = ("jobs", "runner", "rayjobs_agent", "workloads")


def compile_bytecode() -> None:
    """Compile the product's bytecode before anything is timed: in a shell that writes none on import
    (``PYTHONDONTWRITEBYTECODE``), every command would otherwise compile each module changed since the last
    compile, and a command's few hundred milliseconds would measure the compiler."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    # Timestamp-checked, as an install writes them (SOURCE_DATE_EPOCH would make them hash-checked, slower to load).
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "timestamp",
                           *PRODUCT_PACKAGES], cwd=REPO_ROOT, env=env, check=False)
    if done.returncode != 0:
        print("compiling the product's bytecode failed: commands may compile modules as they are timed", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [b.name for b in BENCHMARKS]
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks the harness")
    parser.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=f"run only these: {', '.join(names)}")
    parser.add_argument("--no-write", action="store_true", help="leave docs/benchmarks.md as it is")
    parser.add_argument("--write-quick", action="store_true", help="with --quick: write its tables, marked as quick")
    parser.add_argument("--results", type=Path, default=None, help="folder for the JSON results (default: a new "
                        "temporary folder)")
    parser.add_argument("--render", type=Path, default=None, metavar="DIR",
                        help="run nothing: rewrite the tables from the JSON results in DIR")
    parser.add_argument("--docs", type=Path, default=DOCS, help=argparse.SUPPRESS)
    parser.add_argument("--list", action="store_true", help="list the benchmarks and their commands")
    parser.add_argument("--check", action="store_true", help="run nothing: name the tables and quoted figures "
                        "whose measured code has changed since (exit 1 if any), in well under a second")
    args = parser.parse_args()
    selected = [b for b in BENCHMARKS if not args.only or b.name in args.only]

    if args.list:
        for benchmark in selected:
            print(f"{benchmark.name} (about {benchmark.minutes:g} min on 2 cores)"
                  + (f" [skipped here: {benchmark.missing()}]" if benchmark.missing() else ""))
            for run in benchmark.runs:
                print(f"    full:  benchmarks/{run.script} {' '.join(run.full)}")
                if run.quick is not None:
                    print(f"    quick: benchmarks/{run.script} {' '.join(run.quick)}")
        print(f"total: about {sum(b.minutes for b in selected):g} min for a full run on 2 idle cores")
        return 0

    if args.check:
        return check_docs(args.docs, REPO_ROOT, {b.name: b.digest() for b in selected}, FIGURE_DOCS,
                          skipped=[b.name for b in BENCHMARKS if b not in selected])

    blocks: dict[str, str] = {}
    measured: dict[str, list[dict]] = {}
    failed: list[str] = []
    quick = args.quick
    if args.render:
        for benchmark in selected:
            results = load_results(args.render, benchmark)
            if results is None:
                print(f"{benchmark.name}: no results in {args.render}")
                continue
            quick = quick or any(result.get("quick") for result in results)
            blocks[benchmark.name] = render(results)
            measured[benchmark.name] = results
    else:
        results_dir = args.results or Path(tempfile.mkdtemp(prefix="rayjobs-bench-results-"))
        results_dir.mkdir(parents=True, exist_ok=True)
        print(f"{command_line()}: {len(selected)} benchmark(s), results in {results_dir}", flush=True)
        compile_bytecode()
        started = time.monotonic()
        timings = []
        for benchmark in selected:
            reason = benchmark.missing()
            if reason:
                print(f"\n== {benchmark.name}: skipped: {reason}", flush=True)
                timings.append(f"{benchmark.name}: skipped ({reason})")
                continue
            runs = [(run, run.quick if args.quick else run.full) for run in benchmark.runs]
            runs = [(run, arguments) for run, arguments in runs if arguments is not None]
            results = []
            begun = time.monotonic()
            try:
                for index, (run, arguments) in enumerate(runs):
                    print(f"\n== {benchmark.name}: benchmarks/{run.script} {' '.join(arguments)}", flush=True)
                    # Hashed as the run starts: the code a run measures is the code it started with.
                    digest = benchmark.digest()
                    result = run_one(run, arguments, results_dir / f"{benchmark.name}-{index}.json")
                    result["quick"] = args.quick
                    result["sources_sha256"] = digest
                    (results_dir / f"{benchmark.name}-{index}.json").write_text(
                        json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
                    results.append(result)
            except Exception as exc:  # noqa: BLE001 - one benchmark's failure must not lose the others' figures
                print(f"== {benchmark.name}: FAILED: {exc}", flush=True)
                failed.append(benchmark.name)
                timings.append(f"{benchmark.name}: FAILED after {time.monotonic() - begun:.0f} s")
                continue
            timings.append(f"{benchmark.name}: {time.monotonic() - begun:.0f} s")
            try:
                blocks[benchmark.name] = render(results)
                measured[benchmark.name] = results
            except (KeyError, TypeError, ValueError) as exc:
                print(f"== {benchmark.name}: its results could not be rendered: {exc!r}", flush=True)
                failed.append(benchmark.name)
        print(f"\n{len(selected)} benchmark(s) in {time.monotonic() - started:.0f} s:\n  " + "\n  ".join(timings))
        print(f"results: {results_dir}")

    for name, block in blocks.items():
        print(f"\n<!-- bench:{name} -->\n{block}\n<!-- /bench:{name} -->")
    if args.no_write or (quick and not args.write_quick):
        if blocks:
            print(f"\n{args.docs} left as it is" + (" (quick run: --write-quick writes it)" if quick else ""))
    elif blocks:
        missing = write_sections(args.docs, blocks)
        for name in missing:
            print(f"no <!-- bench:{name} --> markers in {args.docs}: its table was not written")
        print(f"\nrewrote {len(blocks) - len(missing)} table(s) in {args.docs}")
        # A quick run's figures mean nothing, and a --docs elsewhere is a trial: the prose is left alone.
        if not quick and args.docs == DOCS:
            fill_quoted_figures(REPO_ROOT, FIGURE_DOCS, measured)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
