"""Secrets masked by value in everything rayjobs prints or writes (rayjobs_agent/masking.py, and the
client's output paths that use it): no Ray here; the whole path on a cluster is tests/test_secrets_cluster.py."""

from __future__ import annotations

import io
import json
import os

import pytest

from rayjobs_agent.wire import METADATA_SECRETS
from jobs.loader import load_spec
from jobs.secrets import MASK, job_mask, looks_secret, masked
from jobs.submission import build_submission
from runner.errors import BadInput
from runner.follow.log_cursor import LogCursor
from runner.run.lifecycle import follow_job
from tests.support.fake_cluster import FakeClient, Script, speed_up_following
from rayjobs_agent import masking
from rayjobs_agent.masking import SecretMask, mask_url_userinfo

# Fixed values: test ids carry them, and the test processes of a run must collect the same ids.
TOKEN = "tok-5fff17c6ae3f4c64"
PASSWORD = "pw-40eb4f5b12e42335"


# --- the mask itself -----------------------------------------------------------------------------------


def test_every_occurrence_of_a_secret_is_masked():
    mask = SecretMask([TOKEN])
    assert mask.mask_text(f"a {TOKEN} b {TOKEN}{TOKEN}") == "a *** b ******"
    assert mask.mask_bytes(f"a {TOKEN}\n".encode()) == b"a ***\n"


def test_from_environ_takes_the_named_variables_it_sets_and_skips_trivial_values():
    environ = {"API_TOKEN": TOKEN, "DEBUG": "1", "SHORT_SECRET": "abc", "EMPTY": "", "OTHER": "visible"}
    mask = SecretMask.from_environ(environ, ["API_TOKEN", "DEBUG", "SHORT_SECRET", "EMPTY", "UNSET"])
    assert TOKEN in mask.values
    assert mask.mask_text("1 abc visible") == "1 abc visible", "short values would mask every digit"


def test_a_switch_in_a_variable_whose_name_looks_secret_is_not_masked_everywhere():
    mask = SecretMask.from_environ({"TOKENIZERS_PARALLELISM": "false", "API_TOKEN": TOKEN},
                                   ["TOKENIZERS_PARALLELISM", "API_TOKEN"])
    assert mask.mask_text(f"nan: false, token: {TOKEN}") == "nan: false, token: ***"


def test_a_secret_that_contains_another_is_masked_whole():
    mask = SecretMask(["abcd", "abcd-efgh-ijkl"])
    assert mask.mask_text("x abcd-efgh-ijkl y abcd") == "x *** y ***"


def test_a_multi_line_secret_is_masked_line_by_line_too():
    key = "-----BEGIN KEY-----\nMIIEowIBAAKCAQEA\n-----END KEY-----"
    mask = SecretMask([key])
    assert "MIIEowIBAAKCAQEA" not in mask.mask_text("printed alone: MIIEowIBAAKCAQEA")


def test_a_secret_is_masked_as_json_and_a_url_write_it():
    value = 'p"a/ss w@rd'
    mask = SecretMask([value])
    assert value not in mask.mask_text(json.dumps({"v": value}))
    assert json.dumps(value)[1:-1] not in mask.mask_text(json.dumps({"v": value}))
    assert "p%22a%2Fss%20w%40rd" not in mask.mask_text("https://h/?q=p%22a%2Fss%20w%40rd")


@pytest.mark.parametrize(("text", "shown"), [
    ("https://user:secret@host/x", "https://user:***@host/x"),
    ("git+https://tok3n@github.com/o/r.git", "git+https://***@github.com/o/r.git"),
    ("mlflow at http://me:p@ss@mlflow:5000 ok", "mlflow at http://me:***@mlflow:5000 ok"),
    ('{"a":"https://h","b":"c@d"}', '{"a":"https://h","b":"c@d"}'),
    ('"{\\"uri\\": \\"https://u:p@h\\"}"', '"{\\"uri\\": \\"https://u:***@h\\"}"'),
    ("see user@example.com or https://example.com/a@b", "see user@example.com or https://example.com/a@b"),
])
def test_url_userinfo_is_always_masked(text, shown):
    assert mask_url_userinfo(text) == shown
    assert SecretMask(()).mask_text(text) == shown
    assert SecretMask(()).mask_bytes(text.encode()) == shown.encode()


def test_bytes_that_are_not_utf8_are_kept_around_a_masked_secret():
    assert SecretMask([TOKEN]).mask_bytes(b"\xff\xfe " + TOKEN.encode() + b" \xff") == b"\xff\xfe *** \xff"


@pytest.mark.parametrize("text", [
    f"start {TOKEN} then https://me:{PASSWORD}@host/x and abcd{TOKEN[:5]} end",
    "a" * 300 + f"https://me:{PASSWORD}@host",  # a word longer than what is kept of it to read the next piece
])
def test_a_stream_masks_a_secret_split_anywhere(text):
    mask = SecretMask([TOKEN, "abcd"])
    whole = mask.mask_text(text)
    for cut in range(len(text) + 1):
        stream = mask.stream()
        assert stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish() == whole
    stream = mask.stream()
    assert "".join(stream.feed(char) for char in text) + stream.finish() == whole


def test_a_stream_holds_back_only_what_may_be_a_secret():
    stream = SecretMask([TOKEN]).stream()
    assert stream.feed("epoch 1 done\nloss 0.5 ") == "epoch 1 done\nloss 0.5 "
    assert stream.feed("value " + TOKEN[:6]) == "value "
    assert stream.feed(TOKEN[6:] + "\n") == "***\n"


def test_one_mask_and_one_reading_of_the_secret_list_serve_every_side():
    from jobs import secrets
    from jobs.notify import masked_notify_url
    from rayjobs_agent.notify import masked_url

    assert secrets.MASK is masking.MASK == "***"
    url = "slack://TokenA/TokenB/TokenC"
    assert masked_notify_url(url) == masked_url(url) == "slack://***"
    listed = " BESPOKE, ,OTHER ,"
    job_config = json.dumps({"metadata": {METADATA_SECRETS: listed}})
    assert secrets.marked_secrets({"metadata": {METADATA_SECRETS: listed}}) == ["BESPOKE", "OTHER"]
    assert masking.marked_in_job_config({"RAY_JOB_CONFIG_JSON_ENV_VAR": job_config}) == ["BESPOKE", "OTHER"]


@pytest.mark.parametrize("recorded", ["***", "****"])
def test_rerun_takes_a_masked_secret_from_the_environment_whichever_mask_its_record_holds(tmp_path, monkeypatch,
                                                                                         recorded):
    """Records written before one mask served everything hold ``****`` in place of a secret variable's value."""
    from rayjobs_agent.wire import RECORD_ENV_VAR
    from runner.records.rerun import prepare_rerun

    (tmp_path / "code").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(f"name: demo\nentrypoint: python x.py\nruntime_env:\n  working_dir: code\n  env_vars:\n"
                    f"    API_TOKEN: {TOKEN}\n")
    config = json.loads(build_submission(load_spec(path))["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    assert config["spec"]["runtime_env"]["env_vars"] == {"API_TOKEN": MASK}
    config["spec"]["runtime_env"]["env_vars"]["API_TOKEN"] = recorded
    run_dir = tmp_path / "runs" / "demo-raysubmit_1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"status": "SUCCEEDED", "run_dir": str(run_dir), "attempts": [],
                                                  "spec": config["spec"], "code": config["code"]}))
    with pytest.raises(BadInput, match="set API_TOKEN in this shell's environment"):
        prepare_rerun(str(run_dir), [], continue_run=True)
    monkeypatch.setenv("API_TOKEN", TOKEN)
    plan = prepare_rerun(str(run_dir), [], continue_run=True)
    assert plan.loaded.spec.runtime_env.env_vars["API_TOKEN"] == TOKEN


def test_the_client_and_the_job_share_one_rule_for_secret_names():
    assert looks_secret is masking.looks_secret
    assert looks_secret("API_TOKEN") and looks_secret("db_password") and not looks_secret("EPOCHS")


def test_a_name_that_says_where_or_how_is_no_secret():
    assert not looks_secret("RAY_AUTH_TOKEN_PATH") and not looks_secret("RAY_AUTH_MODE")
    assert not looks_secret("SSH_AUTH_SOCK") and looks_secret("RAY_AUTH_TOKEN")
    mask = masking.environment_mask({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/tmp/cluster/auth_token"})
    assert mask.mask_text("the token is at /tmp/cluster/auth_token") == "the token is at /tmp/cluster/auth_token"


def test_the_jobs_mask_covers_the_secrets_of_the_nodes_own_environment():
    # AWS_SECRET_ACCESS_KEY is the node's (code_path needs it there, `cluster up` passes it on), not the job's:
    # the one rule reads the whole environment of the job's process.
    environ = {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-node-secret", "MY_SETTING": "plain-value",
               "BESPOKE": "marked-by-the-spec",
               "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"metadata": {METADATA_SECRETS: "BESPOKE"}})}
    shown = masking.environment_mask(environ).mask_text("wJalrXUtnFEMI-node-secret marked-by-the-spec plain-value")
    assert shown == "*** *** plain-value"


SLACK = "https://hooks.slack.com/services/T0A1B2C3D/B0E1F2G3H/abcdEFGHijklMNOPqrstUVWX"


def test_a_notification_urls_token_printed_alone_is_masked_on_both_sides():
    settings = json.dumps({"targets": [{"url": SLACK, "on": ["failed"]}, {"url": "slack://TokenAA1/TokenBB2/TokenCC3"}]})
    printed = ("posting to https://hooks.slack.com/services/T0A1B2C3D/B0E1F2G3H/abcdEFGHijklMNOPqrstUVWX; "
               "token abcdEFGHijklMNOPqrstUVWX; channel B0E1F2G3H; TokenBB2 via slack services")
    cluster_side = masking.environment_mask({"RAYJOBS_NOTIFY_SECRET": settings}).mask_text(printed)
    client_side = job_mask({"runtime_env": {"env_vars": {"RAYJOBS_NOTIFY_SECRET": settings}}}).mask_text(printed)
    assert cluster_side == client_side
    for token in ("abcdEFGHijklMNOPqrstUVWX", "B0E1F2G3H", "TokenBB2", "T0A1B2C3D"):
        assert token not in cluster_side
    assert "via slack services" in cluster_side  # the words of a URL that are no token stay


@pytest.mark.parametrize("offset", range(-24, 3))
def test_a_line_longer_than_64_kib_is_never_cut_inside_a_secret(offset):
    """A secret placed around 64 KiB into a line with no end yet (where such a line was once cut), cut by every read
    boundary across it, as the record's keeper reads the log; every kind of secret at every cut, on both sides, is
    tests/test_secret_splits.py."""
    secret = b"hunter2-token-value"
    mask = SecretMask([secret.decode(), f"https://me:{PASSWORD}@db"])
    line = b"a" * (64 * 1024 + offset) + secret + b" b " + f"https://me:{PASSWORD}@db".encode() + b"c" * 40
    for cut in range(64 * 1024 + offset - 2, 64 * 1024 + offset + len(secret) + 2):
        stream = mask.stream(bytes)
        kept = stream.feed(line[:cut]) + stream.feed(line[cut:]) + stream.feed(b"\n") + stream.finish()
        assert secret not in kept and PASSWORD.encode() not in kept, cut
        assert kept == mask.mask_bytes(line + b"\n"), cut


# --- what the client prints and writes -----------------------------------------------------------------


def spec_file(tmp_path, body: str = ""):
    path = tmp_path / "job.yaml"
    path.write_text(f"name: demo\nentrypoint: python job.py --key {TOKEN} --db https://me:{PASSWORD}@db/x\n"
                    f"runtime_env:\n  env_vars:\n    API_TOKEN: {TOKEN}\n    PLAIN: visible\n{body}")
    return path


def test_a_masked_submission_holds_no_secret_anywhere(tmp_path):
    submission = build_submission(load_spec(spec_file(tmp_path)))
    shown = json.dumps(masked(submission))
    assert TOKEN not in shown and PASSWORD not in shown
    assert masked(submission)["runtime_env"]["env_vars"] == {"API_TOKEN": MASK, "PLAIN": "visible"}
    assert TOKEN in json.dumps(submission), "the submission itself is sent as written"


def test_secrets_named_in_the_spec_are_masked_by_value_too(tmp_path):
    info = {"entrypoint": "run --flag hunter2x", "metadata": {METADATA_SECRETS: "PLAIN_NAME"},
            "runtime_env": {"env_vars": {"PLAIN_NAME": "hunter2x"}}, "message": "failed: hunter2x"}
    shown = masked(info)
    assert (shown["entrypoint"], shown["message"]) == ("run --flag ***", "failed: ***")
    assert job_mask(info).values


def test_status_and_list_mask_the_entrypoint_and_message():
    from runner.cli.render import jobs_table, run_summary, status_report
    from runner.follow.follower import Outcome

    info = {"submission_id": "raysubmit_x", "status": "FAILED", "runtime_env": {"env_vars": {"API_TOKEN": TOKEN}},
            "entrypoint": f"python job.py {TOKEN} https://me:{PASSWORD}@db/x",
            "message": f"Job failed, last available logs:\ntoken {TOKEN}"}
    printed = status_report(info) + jobs_table([info])
    printed += json.dumps(run_summary("raysubmit_x", 1, Outcome(1, "FAILED", info), "", "addr", []))
    assert TOKEN not in printed and PASSWORD not in printed
    assert "python job.py ***" in printed


def test_a_followed_job_shows_no_secret_in_its_log_its_tail_or_its_failure(tmp_path, monkeypatch):
    speed_up_following(monkeypatch)
    log = (f"connecting with {TOKEN}\n"
           f"ConnectionError: https://me:{PASSWORD}@db/x refused\n").encode() * 3
    client = FakeClient()
    client.existing("raysubmit_s", Script(["RUNNING", "FAILED"], log=log, error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
                                          message=f"last available logs: {TOKEN}", driver_exit_code=1), {})
    # Ray returns the runtime_env a job was submitted with in its info: the values to mask.
    client.records["raysubmit_s"]["runtime_env"] = {"env_vars": {"API_TOKEN": TOKEN}}
    logs, notes = io.StringIO(), io.StringIO()
    result = follow_job(client, "raysubmit_s", notes=notes, logs_out=logs)
    printed = logs.getvalue() + notes.getvalue()
    assert TOKEN not in printed and PASSWORD not in printed
    assert "connecting with ***" in logs.getvalue() and "https://me:***@db/x" in logs.getvalue()
    assert "last lines of its log" in notes.getvalue() and TOKEN not in "".join(result.followed.log_tail)


def test_a_log_delivered_in_pieces_and_again_is_masked_once(tmp_path):
    out = io.StringIO()
    cursor = LogCursor(out)
    cursor.mask_with(SecretMask([TOKEN]))
    data = f"a {TOKEN} b\nc {TOKEN}".encode()
    for start in range(0, len(data), 3):
        cursor.feed(data[start:start + 3], start)
    cursor.feed(data, 0)  # a reconnect replays what was printed
    cursor.finish()
    assert out.getvalue() == "a *** b\nc ***"


def test_a_record_read_back_is_shown_masked():
    from runner.records.report import masked_log, masked_record

    document = {"spec": {"entrypoint": f"run https://me:{PASSWORD}@h", "secret_env_vars": ["PLAIN_NAME"],
                         "runtime_env": {"env_vars": {"PLAIN_NAME": TOKEN}}}}
    shown = json.dumps(masked_record(document))
    assert TOKEN not in shown and PASSWORD not in shown
    assert masked_log(f"GET https://me:{PASSWORD}@h\n") == "GET https://me:***@h\n"


def test_a_kuberay_export_refuses_a_secret_copied_out_of_its_variable(tmp_path):
    from runner.export.kuberay import build_rayjob

    loaded = load_spec(spec_file(tmp_path))
    with pytest.raises(BadInput, match="API_TOKEN") as refused:
        build_rayjob(loaded, build_submission(loaded, beside_agent=False))
    assert TOKEN not in str(refused.value)


def test_a_kuberay_export_still_writes_placeholders_for_secrets(tmp_path):
    from runner.export.kuberay import build_rayjob

    path = tmp_path / "job.yaml"
    path.write_text(f"name: demo\nentrypoint: python job.py\nruntime_env:\n  env_vars:\n    API_TOKEN: {TOKEN}\n")
    loaded = load_spec(path)
    exported = build_rayjob(loaded, build_submission(loaded, beside_agent=False))
    assert TOKEN not in json.dumps(exported.manifest) and "${API_TOKEN}" in json.dumps(exported.manifest)


def test_stacks_name_their_processes_with_the_arguments_masked():
    from runner.follow.progress import RunProgress
    from runner.follow.stacks import job_stacks

    class Dashboard:
        def process_traceback(self, **where: str) -> str:
            return f"Process {where['pid']}: python job.py --key {TOKEN} --db https://me:{PASSWORD}@db/x\n"

    info = {"driver_info": {"pid": 42}, "driver_node_id": "node-1",
            "runtime_env": {"env_vars": {"API_TOKEN": TOKEN}}}
    (driver,) = job_stacks(Dashboard(), info, RunProgress())
    assert driver.text == "Process 42: python job.py --key *** --db https://me:***@db/x\n"


def test_the_record_config_survives_rays_expansion_of_env_var_values(tmp_path):
    # Ray runs os.path.expandvars over every env var's value before the job starts.
    from rayjobs_agent.wire import RECORD_ENV_VAR

    (tmp_path / "code").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text("name: demo\nentrypoint: echo $API_TOKEN\nruntime_env:\n  working_dir: code\n"
                    f"  env_vars:\n    API_TOKEN: {TOKEN}\n")
    written = build_submission(load_spec(path))["runtime_env"]["env_vars"][RECORD_ENV_VAR]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("API_TOKEN", TOKEN)
        expanded = os.path.expandvars(written)
    assert json.loads(expanded)["spec"]["entrypoint"] == "echo $API_TOKEN"
