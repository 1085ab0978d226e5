"""A job that waits for resources, on the session cluster (2 CPUs): named in rayjobs' words, with the numbers,
and said again when its timeout stops it.

A plain Ray script whose task asks for 3 CPUs waits forever; the autoscaler that every `ray start` head
runs says so in the driver log (``(autoscaler +5s) Error: No available node types can fulfill resource
request {'CPU': 3.0}``), every half minute. How Ray Train V1's own warning and the cluster's pending demand
are read is checked without a cluster, in tests/test_follow_signals.py.
"""

from __future__ import annotations

import textwrap

JOB = textwrap.dedent("""\
    import ray

    ray.init()

    @ray.remote(num_cpus=3)
    def needs_three_cpus():
        return 3

    print("asking for 3 CPUs", flush=True)
    print(ray.get(needs_three_cpus.remote()))
""")
WAIT = "waiting for resources: 3 CPUs for one task or actor, 2 on its largest node"


def test_a_task_that_no_node_can_take_is_named_as_a_wait_and_again_when_the_timeout_stops_it(rayjobs_cli, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    spec = tmp_path / "waits.yaml"
    spec.write_text(f"name: waits\nentrypoint: python job.py\nrecord: false\nprogress: false\ntimeout_s: 25\n"
                    f"runtime_env:\n  working_dir: {code}\n")
    result = rayjobs_cli("submit", str(spec), timeout=240)
    assert result.returncode == 5, result.stderr[-3000:]  # stopped at its timeout
    said = result.stderr.splitlines()
    assert [line for line in said if line.startswith(f"rayjobs: {WAIT}")], result.stderr[-3000:]
    summary = next(line for line in said if "ran past its timeout_s" in line and " after " in line)
    assert summary.endswith(f"; it was still {WAIT}"), summary
    assert "No available node types" not in result.stdout, "Ray's line is told in rayjobs' words instead"
    assert "asking for 3 CPUs" in result.stdout
