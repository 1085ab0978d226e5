"""What of a followed job's log reaches the terminal: its own output, without Ray's chatter or the events.

The follower hands every decoded piece of the log to a :class:`LogView`, which cuts it into lines,
takes the progress events out of it (to :class:`runner.follow.progress.RunProgress`), keeps lines
of Ray's own machinery out of sight unless asked (``--raw``), and writes the rest. ``rayjobs logs
JOB`` without ``--follow`` does not come through here: it prints the log exactly as written.
"""

from __future__ import annotations

import io
import re
from typing import Callable, TextIO

from runner.follow.diagnosis import FailureReader
from jobs.keys import EVENT_MARKER
from runner.follow.progress import RunProgress, parse_event

# A colour or cursor sequence; Ray colours the prefix of lines it forwards from other processes,
# even into a log file.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Lines of Ray's own machinery that a job's driver log collects and a user did not write. Each is
# recognised by how it begins after the forwarding prefix, so a job's output that quotes one is
# only hidden when it has the same shape.
_RAY_WARNING = r"^\S*/site-packages/ray/\S+\.py:\d+: \w*Warning: "
_RAY_CHATTER = [re.compile(pattern) for pattern in (
    r"^Reporting training result \d+: TrainingReport\(",
    # Ray's C++ core logs: [2026-11-24 12:00:00,123 I 1234 5678] core_worker.cc:123: ...
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIWEF] \d+ \d+\] \w+\.(cc|h):\d+:",
    # Ray's Python loggers in the driver: 2026-11-24 12:00:00,123\tINFO worker.py:1234 -- ...
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\t(DEBUG|INFO|WARNING) [\w.]+\.py:\d+ -- ",
    # Ray Data's progress lines when no terminal is attached (logging_progress) and its execution notes.
    r"^(Running Dataset|Running: |- \w[\w ()]*: (Tasks|Active|Queued)|Dataset \w+ (execution|dataset_\w+)"
    r"|✔️  Dataset \w+ execution finished)",
    r"^\s*(Operator|Dataset throughput|\* (Ray Data throughput|Estimated single task throughput|"
    r"Extra metrics|Remote wall time|Remote cpu time|UDF time|Peak heap memory|Output num rows|"
    r"Output size bytes|Tasks executed|Operator throughput))",
    r"^Wrapping provided model in DistributedDataParallel\.?$",
    r"^Requesting resources: \{",
    r"^- \(ip=[\d.]+, pid=\d+\) world_rank=\d+",
    r"^Checkpoint successfully created at: Checkpoint\(",
    # Ray Data's bar while it samples a Parquet dataset, drawn with carriage returns into a file.
    r"^Parquet dataset sampling: ",
    # A warning raised inside Ray's own code (site-packages/ray); the source line under it: see LogView._keep.
    _RAY_WARNING,
    r"^\s+warnings\.warn\($",
    r"^Started training worker group of size \d+:",
    r"^- \(node_id=\w+, ip=[\d.]+, pid=\d+\) world_rank=\d+",
    r"^Setting up process group for: ",
    r"^Moving model to device: ",
    r"^Attempting to start training worker group of size \d+",
    r"^\[State Transition\] ",
    r"^Training finished iteration \d+",
)]
# ``(TrainController pid=4711)``, ``(RayTrainWorker pid=12, ip=10.0.0.2)``, ``(raylet)``: Ray's prefix
# on a line it forwarded from another process.
_FORWARD_PREFIX = re.compile(r"^\((?:[\w.]+(?: pid=\d+)?(?:, ip=[\d.]+)?|raylet(?:, ip=[\d.]+)?)\) ")
# Ray's own bars redrawn with carriage returns: held back like any other line that may be hidden.
_RAY_BARS = ("Parquet dataset sampling",)
# A partial line that may still turn out to be an event or chatter is held back until its end.
_MAY_BE_HIDDEN = ("(", "[", "Reporting", "Running", "- ", "Dataset", "Wrapping", "Started", "Setting", "Moving",
                  "Attempting", "Training", "✔", "Requesting", "Checkpoint", "/", " ", EVENT_MARKER,
                  *_RAY_BARS, *"0123456789")
_HELD_PARTIAL_CHARS = 4096


_RAY_WARNING_LINE = re.compile(_RAY_WARNING)


def is_ray_chatter(line: str) -> bool:
    """Whether a log line (colour already removed) is Ray's machinery talking rather than the job."""
    body = _FORWARD_PREFIX.sub("", line, count=1).lstrip("\r")
    return any(pattern.search(body) for pattern in _RAY_CHATTER)


class LogView:
    """A text sink for the follower's log cursor that shows the job's own lines.

    Args:
        out: where the shown lines go.
        on_event: called with each progress event found in the log.
        on_line: called with every complete line, colour removed, shown or not (to read a failure's cause).
        raw: show everything, Ray's chatter and the event lines too, as the log has it.
        strip_ansi: remove colour codes (for output that is not a terminal).
    """

    def __init__(self, out: TextIO, on_event: Callable[[dict], None] | None = None, *, raw: bool = False,
                 strip_ansi: bool = False, on_line: Callable[[str], None] | None = None) -> None:
        self.out = out
        self.on_event = on_event or (lambda event: None)
        self.on_line = on_line or (lambda line: None)
        self.raw = raw
        self.strip_ansi = strip_ansi
        self.hidden_lines = 0
        self._held = ""  # the start of a line not yet complete and not yet shown
        self._warned_by: str | None = None  # the forwarding prefix of a Ray warning just hidden
        self._shown_partial = False  # part of the current line already went out

    @property
    def encoding(self) -> str | None:
        return getattr(self.out, "encoding", None)

    def write(self, text: str) -> int:
        """Take a piece of the log (any length, lines possibly split anywhere)."""
        pending = self._held + text
        self._held = ""
        *complete, last = pending.split("\n")
        shown: list[str] = []
        for line in complete:
            self.on_line(ANSI_ESCAPE.sub("", line))
            event = self._event_in(line)
            if event is not None:
                # What came before the event goes out before anything it leads to is printed.
                self._emit("".join(shown))
                shown = []
                self.on_event(event)
            if self._keep(line, event):
                shown.append(line + "\n")
        if last:
            if self._shown_partial or not self._could_be_hidden(last):
                shown.append(last)
                self._shown_partial = True
            else:
                self._held = last[-_HELD_PARTIAL_CHARS:]
        self._emit("".join(shown))
        return len(text)

    def flush(self) -> None:
        """Flush ``out``; a held partial line stays held until its end or :meth:`close`."""
        self.out.flush()

    def close(self) -> None:
        """The log is over: a last line without an end is shown (if it is not hidden)."""
        if self._held:
            self.on_line(ANSI_ESCAPE.sub("", self._held))
            event = self._event_in(self._held)
            if event is not None:
                self.on_event(event)
            if self._keep(self._held, event):
                self._emit(self._held)
        self._held = ""
        self.out.flush()

    def _could_be_hidden(self, partial: str) -> bool:
        body = ANSI_ESCAPE.sub("", partial)
        return body.startswith(_MAY_BE_HIDDEN) and ("\r" not in body or body.startswith(_RAY_BARS))

    def _event_in(self, line: str) -> dict | None:
        if self._shown_partial:
            return None  # the rest of a line already partly shown is the job's output
        return parse_event(ANSI_ESCAPE.sub("", line))

    def _keep(self, line: str, event: dict | None) -> bool:
        """Whether a complete line is shown."""
        if self._shown_partial:
            # Its start is already on the screen: the rest goes too, whatever it is.
            self._shown_partial = False
            return True
        if self.raw:
            return True
        plain = ANSI_ESCAPE.sub("", line)
        prefix = _FORWARD_PREFIX.match(plain)
        prefix_text = prefix[0] if prefix else ""
        body = plain[len(prefix_text):]
        # Python prints the line of source a warning points at under it, indented: whatever that line is.
        source_of_warning = self._warned_by == prefix_text and body.startswith("  ")
        self._warned_by = prefix_text if _RAY_WARNING_LINE.search(body) else None
        if event is not None or source_of_warning or is_ray_chatter(plain):
            self.hidden_lines += 1
            return False
        return True

    def _emit(self, text: str) -> None:
        if not text:
            return
        text = ANSI_ESCAPE.sub("", text) if self.strip_ansi else text
        try:
            self.out.write(text)
        except UnicodeEncodeError:  # a terminal that cannot show U+FFFD (or the job's own characters)
            encoding = self.encoding or "ascii"
            self.out.write(text.encode(encoding, "replace").decode(encoding))


def read_log(text: str) -> tuple[RunProgress, FailureReader]:
    """What a whole log says: its progress, and the lines that may name why it failed."""
    progress, reader = RunProgress(), FailureReader()
    view = LogView(io.StringIO(), progress.update, on_line=reader.line)
    view.write(text)
    view.close()
    return progress, reader
