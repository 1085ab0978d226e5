"""A secret that reaches a log in pieces, split anywhere, is masked whole on both sides by the one masker
(``rayjobs_agent/masking.py``'s ``MaskingStream``): in what the client prints (``runner/follow/log_cursor.py``)
and in the driver log the job's run record keeps (``rayjobs_agent/record_parts.py``'s ``DriverLog``).

Every kind of secret (a registered value in each form it is written in, a URL's password under schemes with
digits, ``+``, ``-`` and ``.``, a notification URL and its tokens) is placed at the end of a line longer than
64 KiB, at the start of one, inside short lines and inside a line redrawn with carriage returns; the log is cut
into two reads at every offset across the secret and a margin around it, and into three at pairs of them, and
at random places (hypothesis). The secret never shows, and no byte of the text around it is lost or doubled.
"""

from __future__ import annotations

import io
import itertools
import json
import os
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayjobs_agent.masking import environment_mask
from rayjobs_agent.record_parts import DriverLog
from rayjobs_agent.wire import METADATA_SECRETS, NOTIFY_ENV_VAR, RAY_JOB_CONFIG_ENV_VAR
from runner.follow.log_cursor import LogCursor

# An AWS secret access key of the documentation's own example.
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

TOKEN = "tok-5fff17c6ae3f4c64"
MARKED = "marked-by-the-spec-42"  # named in the spec's secret_env_vars; its name looks like nothing
QUOTED = 'p"a/ss w@rd-9Z'  # written differently inside JSON and inside a URL
SLACK = "https://hooks.slack.com/services/T0A1B2C3D/B0E1F2G3H/abcdEFGHijklMNOPqrstUVWX"
NOTIFY_URLS = [SLACK, "slack://TokenAA1/TokenBB2/TokenCC3",
               "json://hookuser:hookpass99@hooks.example.com:8080/in/tok3nvalue42",
               "tgram://123456789:AAbbCCddEEff0011/-100200300", "discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js",
               "ntfy://my-secret-topic-7"]
# The environment of a job's process, as the agent masks it (and the client, from the same variables).
ENVIRON = {"API_TOKEN": TOKEN, "BESPOKE": MARKED, "DB_PASSWORD": QUOTED, "PLAIN": "plain-value",
           NOTIFY_ENV_VAR: json.dumps({"targets": [{"url": url, "on": ["failed"]} for url in NOTIFY_URLS]}),
           RAY_JOB_CONFIG_ENV_VAR: json.dumps({"metadata": {METADATA_SECRETS: "BESPOKE"}})}
MASK = environment_mask(ENVIRON)

# name: (what the job prints, what must be shown of it, what of it must never show)
SECRETS = {
    # registered values, in each form they are written in
    "value": (f"token {TOKEN}", "token ***", [TOKEN]),
    "value named in the spec": (f"--flag={MARKED}", "--flag=***", [MARKED]),
    "value inside JSON": (json.dumps({"password": QUOTED}), '{"password": "***"}', [json.dumps(QUOTED)[1:-1]]),
    "value inside a URL": (f"GET /login?pw={quote(QUOTED, safe='')}", "GET /login?pw=***", [quote(QUOTED, safe="")]),
    # URL credentials, registered or not
    "postgres": ("postgres://admin:hunter2pass@db/x", "postgres://admin:***@db/x", ["hunter2pass"]),
    "postgresql+psycopg2": ("postgresql+psycopg2://app:s3cr3t-pw@db.internal:5432/app",
                            "postgresql+psycopg2://app:***@db.internal:5432/app", ["s3cr3t-pw"]),
    "mongodb+srv": ("mongodb+srv://root:Mongo-Pass-77@cluster0.example.net/?w=1",
                    "mongodb+srv://root:***@cluster0.example.net/?w=1", ["Mongo-Pass-77"]),
    "redis, no user": ("redis://:redispass1234@cache:6379/0", "redis://:***@cache:6379/0", ["redispass1234"]),
    "git+https, token only": ("git+https://ghp_tokenvalue123456@github.com/o/r.git",
                              "git+https://***@github.com/o/r.git", ["ghp_tokenvalue123456"]),
    "s3.compat-2": ("s3.compat-2://key:secretkey99@store", "s3.compat-2://key:***@store", ["secretkey99"]),
    "password with @": ("mlflow at http://me:p@ss-w0rd@mlflow:5000 ok", "mlflow at http://me:***@mlflow:5000 ok",
                        ["p@ss-w0rd"]),
    # notification URLs, whole, and their tokens printed alone
    "slack webhook": (f"posting to {SLACK}", "posting to ***", ["abcdEFGHijklMNOPqrstUVWX", "B0E1F2G3H", "T0A1B2C3D"]),
    "slack webhook token": ("token abcdEFGHijklMNOPqrstUVWX alone", "token *** alone", ["abcdEFGHijklMNOPqrstUVWX"]),
    "slack://": ("slack://TokenAA1/TokenBB2/TokenCC3", "***", ["TokenAA1", "TokenBB2", "TokenCC3"]),
    "slack:// token": ("channel TokenBB2 only", "channel *** only", ["TokenBB2"]),
    "json:// webhook": (NOTIFY_URLS[2], "***", ["hookpass99", "tok3nvalue42"]),
    "telegram bot token": ("tgram bot 123456789:AAbbCCddEEff0011", "tgram bot ***:***",
                           ["123456789", "AAbbCCddEEff0011"]),
    "discord token": ("discord JHMHI8qBe7bk2ZwO5U711o3dV_js", "discord ***", ["JHMHI8qBe7bk2ZwO5U711o3dV_js"]),
    "ntfy topic": ("subscribe my-secret-topic-7", "subscribe ***", ["my-secret-topic-7"]),
}
LONG = 70_000  # longer than the 64 KiB a line was once held for masking, and cut at
# (text before the secret, text after it)
PLACES = {
    "end of a long line": ("x" * LONG + " ", " and on\nnext line\n"),
    "start of a long line": ("before\n", " " + "y" * LONG + "\nafter\n"),
    "short lines": ("epoch 1 done\ndonnées → connecting ", " ok\nepoch 2\n"),
    "a redrawn line": ("progress 10%\rprogress 20% ", "\rprogress 30%\n"),
}
# Cuts go across the secret and this far on either side of it.
MARGIN = 6


class GrowingLog:
    """The driver log as the agent reads it: each read returns what was written since the last."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.at = 0

    def write(self, data: bytes) -> None:
        self.written += data

    def read(self, size: int) -> bytes:
        data = bytes(self.written[self.at:self.at + size])
        self.at += len(data)
        return data


def kept_by_the_record(pieces: list[bytes]) -> bytes:
    """What the run record keeps of a log that reaches the agent in ``pieces``."""
    file = GrowingLog()
    log = DriverLog(file, MASK)
    kept = b""
    for number, piece in enumerate(pieces, 1):
        file.write(piece)
        kept += b"".join(log.read(ended=number == len(pieces)))
    return kept


def printed_by_the_client(pieces: list[bytes]) -> str:
    """What the client prints of a log that reaches it in ``pieces``."""
    out = io.StringIO()
    cursor = LogCursor(out)
    cursor.mask_with(MASK)
    start = 0
    for piece in pieces:
        cursor.feed(piece, start)
        start += len(piece)
    cursor.finish()
    return out.getvalue()


def cut(data: bytes, offsets: tuple[int, ...]) -> list[bytes]:
    bounds = [0, *offsets, len(data)]
    return [data[start:end] for start, end in zip(bounds, bounds[1:])]


def check_both_sides(data: bytes, offsets: tuple[int, ...], shown: str, hidden: list[str]) -> None:
    pieces = cut(data, offsets)
    kept, printed = kept_by_the_record(pieces), printed_by_the_client(pieces)
    for secret in hidden:
        assert secret.encode() not in kept, (secret, offsets)
        assert secret not in printed, (secret, offsets)
    assert kept == shown.encode(), offsets
    assert printed == shown, offsets


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("secret", SECRETS)
def test_a_secret_cut_into_two_reads_anywhere_across_it_is_masked_whole_on_both_sides(place, secret):
    before, after = PLACES[place]
    printed, shown, hidden = SECRETS[secret]
    data = (before + printed + after).encode()
    start = len(before.encode())
    for offset in range(start - MARGIN, start + len(printed) + MARGIN + 1):
        check_both_sides(data, (offset,), before + shown + after, hidden)


@pytest.mark.parametrize("place", ["short lines", "a redrawn line"])
@pytest.mark.parametrize("secret", SECRETS)
def test_a_secret_cut_into_three_reads_is_masked_whole_on_both_sides(place, secret):
    before, after = PLACES[place]
    printed, shown, hidden = SECRETS[secret]
    data = (before + printed + after).encode()
    start = len(before.encode())
    offsets = range(start - MARGIN, start + len(printed) + MARGIN + 1, 3)
    for pair in itertools.combinations(offsets, 2):
        check_both_sides(data, pair, before + shown + after, hidden)


def test_a_url_cut_inside_its_scheme_after_a_long_line_keeps_its_password_out_of_the_record():
    # The scheme's "://" is cut in two; the line before it is longer than a line was once held for.
    first, second = ("x" * LONG + " postgres:/").encode(), b"/admin:hunter2pass@db/x\n"
    assert kept_by_the_record([first, second]) == ("x" * LONG + " postgres://admin:***@db/x\n").encode()
    assert printed_by_the_client([first, second]) == "x" * LONG + " postgres://admin:***@db/x\n"


SEPARATORS = st.sampled_from([" ", "\n", "\r", " \r", "\r\n"])
PIECES = st.one_of(st.sampled_from(list(SECRETS.values())),
                   st.sampled_from(["epoch 3 loss 0.25", "x" * 3000, "données", "http", "tok-5fff", "://", "@"]))


# Drawn afresh at every run of the suite, as many as the other property tests draw.
@settings(max_examples=int(os.environ.get("RAYJOBS_PROPERTY_EXAMPLES", "50")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.tuples(PIECES, SEPARATORS), min_size=1, max_size=8), long_first=st.booleans(),
       data=st.data())
def test_a_log_of_secrets_and_text_split_at_random_is_masked_as_it_is_whole(pieces, long_first, data):
    text, shown, hidden = ("z" * LONG + "\n", "z" * LONG + "\n", []) if long_first else ("", "", [])
    for piece, separator in pieces:
        if isinstance(piece, tuple):
            printed, masked, secrets = piece
            text, shown, hidden = text + printed + separator, shown + masked + separator, hidden + secrets
        else:
            text, shown = text + piece + separator, shown + piece + separator
    encoded = text.encode()
    offsets = data.draw(st.lists(st.integers(0, len(encoded)), max_size=6).map(lambda cuts: tuple(sorted(cuts))))
    check_both_sides(encoded, offsets, shown, hidden)


@pytest.mark.parametrize("line", [
    "botocore.exceptions.ClientError: AccessDenied while reading " + "x" * 210
    + " s3://AKIAEXAMPLE:SuperSecretPassw0rd@minio.internal/bucket",
    "botocore.exceptions.ClientError: SignatureDoesNotMatch " + "y" * 220 + f" key={SECRET_KEY}",
], ids=["url-password", "secret-value"])
def test_a_cause_whose_evidence_is_cut_short_shows_no_piece_of_a_secret(tmp_path, capsys, line):
    # A cause's evidence is the line cut to 300 characters; cut before it is masked, the secret's start survives.
    from rayjobs_agent.judge import Judge, OwnLog

    log = tmp_path / "driver.log"
    log.write_text(line + "\n")
    judge = Judge({"AWS_SECRET_ACCESS_KEY": SECRET_KEY})
    judge.lines = OwnLog(log.open("rb"))
    fields = judge.decide(attempt=1, code=1)
    said = json.dumps(fields) + capsys.readouterr().out
    assert "***" in fields["evidence"]
    for piece in ("SuperSe", SECRET_KEY[:6]):
        assert piece not in said


def test_a_log_page_cut_inside_a_long_line_never_shows_a_url_password_half_on_each_page(tmp_path):
    # Each page of the history page's log view is masked on its own; a line over the page's slack is cut at a
    # byte, which must never fall inside a URL's credentials.
    from rayjobs_agent.record_layout import log_folder
    from runner.records.store import Folder
    from runner.ui.log_pages import PAGE_BYTES, log_page

    url = "postgres://user:TOPSECRETPW@db.example/x"
    for cut in range(1, len(url)):
        run = tmp_path / f"cut-{cut}"
        (run / log_folder("raysubmit_x")).mkdir(parents=True)
        log = b"a" * (PAGE_BYTES - cut) + url.encode() + b" " + b"b" * 70_000 + b"\nend\n"
        (run / log_folder("raysubmit_x") / "00000.log").write_bytes(log)
        pages = [log_page(Folder(str(run)), "raysubmit_x", page)["text"] for page in (0, 1)]
        shown = "".join(pages)
        assert len(shown) == len(log) - len("TOPSECRETPW") + len("***"), cut
        assert "postgres://user:***@db.example/x" in shown, cut
        assert not any(piece in page for page in pages for piece in ("TOPS", "RETPW")), cut
