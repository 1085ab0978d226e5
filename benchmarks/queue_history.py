"""A cluster queue under a nemesis for as long as it is given, its whole history checked (in the manner of Jepsen).

    python benchmarks/queue_history.py [--minutes 10] [--seed N] [--clients 3] [--json PATH]

The run of tests/test_queue_history_cluster.py, longer: clients submit (the ``rayjobs`` command and the Python
API, fixed and generated ids, three priorities, ``--no-wait`` and followed), stop jobs and set a queue's limit,
while a nemesis kills the keeper (also the moment it claims a slot), jobs' wrappers and submitting clients, cuts the
clients' connections, and kills and restarts the head (its GCS kept in Redis), about once per minute and a half of
each kind. The run is cut into rounds of ``--round-minutes`` on a fresh cluster each, seeded ``SEED``, ``SEED+1``,
…: each round's history is checked on its own, and a round that fails prints its seed (run it again with
``--seed SEED --minutes ROUND``) and the offending part of its history. The figures are what
docs/reliability.md quotes: operations, faults of each kind, violations, and the time from a slot freeing to the
next admission under faults. Each round's history and final state stay in ``--keep DIR`` when given, and
``--check DIR/seed-N/run.json`` checks a kept round again (after a change to the checker) without a cluster.

A checker can show a bug, never the absence of one: run it long, and with other seeds.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import Result, Spread, Stamp, add_json_option


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="clients' time in all (the checks come on top)")
    parser.add_argument("--round-minutes", type=float, default=5.0, help="clients' time of one round (one cluster)")
    parser.add_argument("--seed", type=int, default=None, help="the first round's seed (default: drawn, and printed)")
    parser.add_argument("--clients", type=int, default=3, help="client threads")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR", help="keep each round's history here")
    parser.add_argument("--check", type=Path, default=None, metavar="RUN_JSON", help="check a kept round again "
                        "(DIR/seed-N/run.json), with this checker, and run nothing")
    add_json_option(parser)
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if args.check is not None:
        from tests.support.queue_history import check, load_run

        report = check(*load_run(args.check))
        print(report.text())
        return 1 if report.violations else 0

    from tests.support.queue_nemesis import Plan, run_history

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    rounds = max(1, math.ceil(args.minutes / args.round_minutes))
    round_s = args.minutes * 60 / rounds
    stamp = Stamp.begin()
    result = Result("queue_history", "A cluster queue under a nemesis: the history checked",
                    ["seed", "clients' time", "ops (ok/info/fail)", "faults", "jobs", "violations",
                     "slot freed → next admission (median, p90, max)"], [], stamp)
    delays: list[float] = []
    totals: dict[str, int] = {}
    failed = []
    for index in range(rounds):
        round_seed = seed + index
        # About one fault of each kind per minute and a half of clients, a head restart per round.
        per_kind = max(1, round(round_s / 90))
        plan = Plan(seed=round_seed, client_s=round_s, clients=args.clients, head_restarts=1,
                    keeper_kills=per_kind, keeper_kills_at_claim=per_kind, wrapper_kills=per_kind,
                    proxy_cuts=2 * per_kind, client_kills=per_kind, quiet_guard_s=600.0)
        with tempfile.TemporaryDirectory(prefix="rayjobs-queue-history-") as scratch:
            workdir = (args.keep / f"seed-{round_seed}") if args.keep else Path(scratch)
            started = time.monotonic()
            run = run_history(plan, workdir)
            report = run.report
            print(report.text(), flush=True)
            print(f"round {index + 1} of {rounds}: seed {round_seed}, {time.monotonic() - started:.0f}s", flush=True)
        figures = report.figures
        if report.violations:
            failed.append(round_seed)
        ops = figures["ops_by_kind"]
        outcomes = {outcome: sum(count for key, count in ops.items() if key.endswith(f":{outcome}"))
                    for outcome in ("ok", "info", "fail")}
        for kind, count in figures["faults"].items():
            totals[kind] = totals.get(kind, 0) + count
        spread = figures["admission_after_slot_frees_s"] or {}
        delays += report.delays
        result.rows.append([str(round_seed), f"{round_s / 60:.1f} min",
                            f"{figures['ops']} ({outcomes['ok']}/{outcomes['info']}/{outcomes['fail']})",
                            ", ".join(f"{kind} {count}" for kind, count in figures["faults"].items()),
                            str(figures["jobs"]), str(figures["violations"]),
                            f"{spread.get('median', '–')} / {spread.get('p90', '–')} / {spread.get('max', '–')} s"])
    if delays:
        result.figure("admission_after_slot_frees", Spread.of(delays), "s")
    result.figures["faults"] = totals
    result.figures["failed_seeds"] = failed
    result.notes.append(f"{rounds} round(s) of {round_s / 60:.1f} min of clients on a fresh 2-CPU local cluster each, "
                        "its GCS in Redis; seeds from " + str(seed))
    print("\n".join(" | ".join(row) for row in result.rows), flush=True)
    result.save(args.json)
    if failed:
        print(f"violations in the rounds of seed(s) {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
