"""A queue's quota set and read through the real `rayjobs` command on the session cluster: shown with what is held,
a job bigger than the whole quota refused at submission, a quota of nothing or a name a shell would read refused."""

from __future__ import annotations

import json
import uuid

from tests.support.waiting import HANG_GUARD_S, wait_for_condition


def test_a_quota_is_shown_with_what_is_held_and_a_job_bigger_than_it_is_refused_at_submission(rayjobs_cli, tmp_path):
    queue = f"quota-{uuid.uuid4().hex[:8]}"
    limited = rayjobs_cli("queue", "set", queue, "--max-running", "3", "--max-cpus", "1", "--max", "memory=2e9")
    assert limited.returncode == 0, limited.stderr
    assert f"queue {queue}: 0 of 3 running, 0 waiting; 0 of 1 CPU held; 0 of 2e+09 memory held" in limited.stdout
    # The keeper publishes its snapshot after the step that set the quota: `queue` reads it once it has.
    shown = wait_for_condition(lambda: json.loads(rayjobs_cli("queue", queue, "--output", "json").stdout)[0].get(
        "quota") and json.loads(rayjobs_cli("queue", queue, "--output", "json").stdout)[0], timeout_s=HANG_GUARD_S)
    assert shown["quota"] == {"CPU": 1.0, "memory": 2e9} and shown["max_running"] == 3

    spec = tmp_path / "big.yaml"
    spec.write_text(f"name: big\nentrypoint: echo never\nqueue: {queue}\nneeds: {{CPU: 2}}\n")
    refused = rayjobs_cli("submit", str(spec), "--no-wait")
    assert refused.returncode == 2, refused.stderr
    assert f"the job needs CPU 2, more than queue {queue}'s whole quota (CPU 1)" in refused.stderr
    assert "submitted" not in refused.stderr


def test_a_quota_of_nothing_or_a_resource_a_shell_would_read_is_refused_before_anything_is_sent(rayjobs_cli):
    for flags, said in ((["--max-cpus", "0"], "lets no job in"), (["--max", "x;touch /tmp/p=1"], "cannot name a resource"),
                        (["--max", "GPU"], "write RESOURCE=N")):
        result = rayjobs_cli("queue", "set", "quota-refused", *flags)
        assert result.returncode == 2 and said in result.stderr, (flags, result.stderr)
    assert json.loads(rayjobs_cli("queue", "quota-refused", "--output", "json").stdout)[0].get("quota") is None
