"""The log cursor and the resume point: a log delivered again, or from a tail, is never printed twice."""

from __future__ import annotations

import io
import random

import pytest

from runner.follow.log_cursor import LogCursor
from runner.client.log_resume import ANCHOR_BYTES, KEPT_BYTES, REPLAY_BELOW_BYTES, Misaligned, TailAligner, plan_resume


def test_replayed_stream_prints_each_byte_once():
    out = io.StringIO()
    cursor = LogCursor(out)
    cursor.feed(b"a\nb\n", 0)
    cursor.feed(b"c\n", 4)
    # The connection dropped; the new one replays from the start, in other chunk sizes.
    cursor.feed(b"a\nb", 0)
    cursor.feed(b"\nc\nd\n", 3)
    cursor.feed(b"a\nb\nc\nd\ne\n", 0)  # the final full-log fetch
    assert out.getvalue() == "a\nb\nc\nd\ne\n"
    assert cursor.tail_lines() == ["a", "b", "c", "d", "e"]


def test_partial_lines_are_kept_for_the_tail():
    out = io.StringIO()
    cursor = LogCursor(out, keep_lines=2)
    cursor.feed(b"one\ntwo\nthr", 0)
    cursor.feed(b"ee", 11)
    assert cursor.tail_lines() == ["two", "three"]


def test_invalid_utf8_in_any_chunking_prints_like_one_decode():
    log = (b"caf\xe9 \xff\xfe\x80\n" + "€ über ✓\n".encode() + b"cut \xe2\x82\n" + b"progress 10%\rprogress 20%\r\n"
           + b"\xf0\x9f\x98" + b"\x80 end \xe2\x82")  # an emoji complete across writes; a truncated end
    rng = random.Random(7)
    for _ in range(200):
        out = io.StringIO()
        cursor = LogCursor(out)
        offset = 0
        while offset < len(log):
            size = rng.randint(1, 7)
            start = max(0, offset - rng.randint(0, 5))  # overlapping redeliveries, as after a reconnect
            cursor.feed(log[start:offset + size], start)
            offset += size
        cursor.finish()
        assert out.getvalue() == log.decode("utf-8", "replace")
    assert cursor.tail_lines()[-2:] == ["progress 20%", "\U0001f600 end \ufffd"]


def _numbered_log(lines: int) -> bytes:
    return b"".join(b"%06d some text of a line\n" % i for i in range(lines))


def _align(plan, tail: bytes, chunk: int = 1000) -> int | None:
    """Where the tail starts in the log, by the resume point found in it."""
    aligner = TailAligner(plan)
    for start in range(0, len(tail), chunk):
        found = aligner.add(tail[start:start + chunk])
        if found is not None:
            return plan.resume_at - found - aligner.dropped
    return None


def test_resume_point_is_found_in_a_tail():
    log = _numbered_log(20_000)
    printed = len(log) // 2 + 13  # inside a line
    kept = log[:printed]
    plan = plan_resume(kept, printed, expected_new_lines=10)
    assert not plan.replay and plan.lines > 10
    tail_start = log.rfind(b"\n", 0, printed - 5000) + 1
    assert _align(plan, log[tail_start:tail_start + 100]) is None  # not arrived yet
    assert _align(plan, log[tail_start:]) == tail_start


def test_a_tail_reaching_back_past_the_kept_log_is_aligned_too():
    log = _numbered_log(200_000)  # 5 MB
    printed = len(log) - 1000
    kept = log[printed - KEPT_BYTES // 4:printed]  # as if only 1 MiB had been kept
    plan = plan_resume(kept, printed, expected_new_lines=150_000)  # a wild overestimate
    assert _align(plan, log, chunk=65536) == 0


def test_a_tail_that_starts_after_the_resume_point_is_refused():
    log = _numbered_log(20_000)
    printed = len(log) // 2
    plan = plan_resume(log[:printed], printed, expected_new_lines=10)
    tail_start = log.index(b"\n", printed + 100) + 1
    with pytest.raises(Misaligned):
        _align(plan, log[tail_start:] * 3)  # never the anchor, and more than the tail should be


def test_repetitive_or_short_logs_are_replayed_from_the_start():
    same_line = b"the same line\n" * 100_000
    assert plan_resume(same_line, len(same_line), 10).replay  # the anchor would match in many places
    short = _numbered_log(100)
    assert len(short) < REPLAY_BELOW_BYTES and plan_resume(short, len(short), 10).replay
    log = _numbered_log(20_000)
    assert plan_resume(log, len(log), 10, escalation=4).replay  # tails kept missing the resume point
    assert len(plan_resume(log, len(log), 10).anchor) == ANCHOR_BYTES
