"""How long `rayjobs` takes to refuse a bad spec, against a bare Python interpreter starting and exiting.

    python benchmarks/refusal_latency.py [--rounds 5] [--json PATH]

A refused spec never reaches a cluster, so the whole cost is the process: starting Python,
importing what the command needs (pydantic and the spec models, never ray or torch) and
reading the file. The baseline is ``python -c pass`` with the same interpreter, so the ratio
says how many interpreter start-ups a refusal costs. Three specs: a typo (the common case),
5000 levels of nesting and an alias bomb (the slowest cases of tests/corpus), each through
``rayjobs validate`` and ``rayjobs submit --address <a closed port>``. Every command must exit 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, timed_command  # noqa: E402

CLOSED_ADDRESS = "http://127.0.0.1:9"


def bad_specs(directory: Path) -> dict[str, Path]:
    """The three refused specs, written into ``directory``."""
    nested = directory / "deeply_nested.yaml"
    nested.write_bytes(b"name: demo\nentrypoint: run\nmetadata: " + b"[" * 5000 + b"]" * 5000 + b"\n")
    lines = ["name: demo", "entrypoint: run", 'a: &a ["x","x","x","x","x","x","x","x","x"]']
    for previous, current in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{current}: &{current} [" + ",".join([f"*{previous}"] * 9) + "]")
    bomb = directory / "alias_bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    return {"typo": REPO / "tests" / "corpus" / "specs" / "typo_top_level.yaml", "deeply nested": nested,
            "alias bomb": bomb}


def timed(command: list[str], expected_code: int) -> float:
    """Wall seconds of one run of ``command``, which must exit with ``expected_code``."""
    return timed_command(command, expected_code, cwd=REPO)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every command (medians are reported)")
    add_json_option(parser)
    args = parser.parse_args()

    rayjobs = str(Path(sys.executable).parent / "rayjobs")
    stamp = Stamp.begin()
    result = Result("refusal_latency", "Refusing a bad spec",
                    ["spec", "command", "median (min–max)", "bare interpreter", "ratio (min–max)"], [], stamp)
    with tempfile.TemporaryDirectory(prefix="rayjobs-refusal-") as scratch:
        specs = bad_specs(Path(scratch))
        sides = {"bare interpreter": lambda: timed([sys.executable, "-c", "pass"], 0)}
        for label, spec in specs.items():
            sides[f"validate {label}"] = lambda spec=spec: timed([rayjobs, "validate", str(spec)], 2)
            sides[f"submit {label}"] = lambda spec=spec: timed(
                [rayjobs, "submit", str(spec), "--address", CLOSED_ADDRESS], 2)
        times = alternate(sides, args.rounds,
                          show=lambda index, got: print(f"round {index + 1}: " + ", ".join(
                              f"{name} {seconds:.2f}s" for name, seconds in got.items()), flush=True))
    baseline = result.figure("bare interpreter", Spread.of(times.pop("bare interpreter")), "s")
    for name, values in times.items():
        command, label = name.split(" ", 1)
        spread = result.figure(name, Spread.of(values), "s")
        # Ratios round by round: a moment of load falls on both sides of the same round.
        ratios = Spread.of([ours / bare for ours, bare in zip(values, baseline.values)])
        print(f"{name:<24} median {spread.median:.2f}s ({spread.low:.2f}-{spread.high:.2f}) | bare interpreter "
              f"{baseline.median:.2f}s | ratio {ratios.median:.1f}x ({ratios.low:.1f}-{ratios.high:.1f})", flush=True)
        result.rows.append([label, f"`rayjobs {command}`", f"{spread.median:.2f} s ({spread.low:.2f}–{spread.high:.2f})",
                            f"{baseline.median:.3f} s", f"**{ratios.median:.1f}×** ({ratios.low:.1f}–{ratios.high:.1f})"])
    result.save(args.json)


if __name__ == "__main__":
    main()
