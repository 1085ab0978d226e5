"""The log cursor: a log delivered again from its start is never printed twice."""

from __future__ import annotations

import io

from runner.follow import LogCursor


def test_replayed_stream_prints_each_character_once():
    out = io.StringIO()
    cursor = LogCursor(out)
    cursor.feed("a\nb\n", 0)
    cursor.feed("c\n", 4)
    # The connection dropped; the new one replays from the start, in other chunk sizes.
    cursor.feed("a\nb", 0)
    cursor.feed("\nc\nd\n", 3)
    cursor.feed("a\nb\nc\nd\ne\n", 0)  # the final full-log fetch
    assert out.getvalue() == "a\nb\nc\nd\ne\n"
    assert cursor.tail_lines() == ["a", "b", "c", "d", "e"]


def test_partial_lines_are_kept_for_the_tail():
    out = io.StringIO()
    cursor = LogCursor(out, keep_lines=2)
    cursor.feed("one\ntwo\nthr", 0)
    cursor.feed("ee", 11)
    assert cursor.tail_lines() == ["two", "three"]
