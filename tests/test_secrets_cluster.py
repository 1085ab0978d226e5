"""Secrets stay secret on a real cluster: a job that prints its token and a URL's password, and passes another
URL with a password as an argument, leaves neither value in any file of its run record nor in any byte the
commands print (follow, status, list, logs, show). The masking itself is tested in tests/test_secrets.py."""

from __future__ import annotations

import os
import textwrap

from typer.testing import CliRunner

from runner.cli.app import app
from runner.local import loopback_env


def test_planted_secrets_appear_in_no_file_of_the_record_and_no_byte_of_output(ray_cluster, rayjobs_cli, tmp_path):
    token, password = "tok-" + os.urandom(12).hex(), "pw-" + os.urandom(12).hex()
    code = tmp_path / "code"
    code.mkdir()
    (code / "show.py").write_text(textwrap.dedent(f"""\
        import os, sys
        print("token:", os.environ["API_TOKEN"], flush=True)
        print("database: https://user:{password}@example.invalid/x", flush=True)
        print("arguments:", sys.argv[1:], flush=True)
        sys.exit(1)
        """))
    records = tmp_path / "records"
    spec = tmp_path / "secrets.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: planted-secrets
        entrypoint: echo "from the shell $API_TOKEN" && python show.py https://user:{password}@example.invalid/arg
        record_path: {records}
        record_every_s: 1
        runtime_env:
          working_dir: {code}
          env_vars:
            API_TOKEN: {token}
        """))

    submitted = rayjobs_cli("submit", str(spec))
    outputs = [(("submit",), submitted)]
    assert submitted.returncode == 1, submitted.stderr
    assert "from the shell ***" in submitted.stdout, "the job ran and its output was masked, not dropped"
    (run,) = records.iterdir()
    job_id = run.name.removeprefix("planted-secrets-")
    # The commands that read run in this process, through the same command-line app: typer's runner keeps every
    # byte they print, and six Python start-ups (each importing the CLI) are spared.
    for args in (("status", job_id), ("status", job_id, "--output", "json"), ("list", "--output", "json"),
                 ("logs", job_id), ("logs", str(run)), ("show", str(run), "--output", "json")):
        done = CliRunner().invoke(app, list(args), env=loopback_env(ray_cluster), catch_exceptions=False)
        assert done.exit_code in (0, 1), (args, done.stderr)
        outputs.append((args, done))

    leaks = [f"`rayjobs {' '.join(args)}` {stream}" for args, done in outputs
             for stream, text in (("stdout", done.stdout), ("stderr", done.stderr))
             if token in text or password in text]
    files = sorted(path for path in run.rglob("*") if path.is_file())
    saved_log = b"".join(path.read_bytes() for path in files if path.suffix == ".log")
    assert b"token: ***" in saved_log, "the record kept the driver log, masked"
    assert "token: ***" in dict(outputs)[("logs", job_id)].stdout, "`logs ID` knows the values from the job's info"
    leaks += [str(path.relative_to(run)) for path in files
              if token.encode() in path.read_bytes() or password.encode() in path.read_bytes()]
    assert leaks == [], f"the planted secrets were found in: {leaks}"
