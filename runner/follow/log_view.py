"""What of a followed job's log reaches the terminal: its own output, without Ray's chatter or the events.

The follower hands every decoded piece of the log to a :class:`LogView`, which cuts it into lines,
takes the progress events out of it (to :class:`runner.follow.progress.RunProgress`), keeps lines
of Ray's own machinery out of sight unless asked (``--raw``), and writes the rest. An error is never
chatter: Ray's ERROR and FATAL lines are always shown. Ray's complaints that the job waits for
resources are taken out: the agent's judge names the wait in its own line (``rayjobs_agent.watch``), beside the job
or, for a job without the agent, in the follower (``runner.follow.watching``). In a pipe, a
progress bar redrawn with carriage returns is written once, as its last state. ``rayjobs logs JOB``
without ``--follow`` does not come through here: it prints the log exactly as written.

Which lines are Ray's own is the agent's rule (``rayjobs_agent.ray_lines``).
"""

from __future__ import annotations

import io
import re
from collections.abc import Collection
from typing import Any, Callable, TextIO

from rayjobs_agent.causes import Diagnosis, FailureReader
from rayjobs_agent.vocabulary import EVENT_MARKER, EventKind, kind_of
from rayjobs_agent.vocabulary import decode as parse_event
from runner.follow.progress import RunProgress
from rayjobs_agent.ray_lines import ANSI_ESCAPE, FORWARD_PREFIX, RAY_WARNING_LINE, is_ray_chatter
from rayjobs_agent.waits import resource_wait_in
from rayjobs_agent.wire import OWN_LINE_PREFIX

# A tqdm bar's state: ``Parquet dataset sampling: 100%|##########| 3.00/3.00 [00:00<00:00, 12.4k file/s]``.
_TQDM_BAR = re.compile(r"^(?P<desc>.*?)(?P<pct>\d{1,3}%)\|[^|]*\|\s*(?P<done>[\d.]+[kMGTP]?)/(?P<total>[\d.]+[kMGTP]?)")
# Lines a workload prints that say what an event says too; the follower's line for the event stays.
_STAGE_ECHO = re.compile(r"^Stage (\S+) finished in [\d.]+s$")
_EPOCH_ECHO = re.compile(r"^epoch (\d+)/\d+[:,]? ")
# A partial line that may still turn out to be an event or chatter is held back until its end.
_MAY_BE_HIDDEN = (OWN_LINE_PREFIX, "(", "[", "Reporting", "Running", "- ", "Dataset", "Wrapping", "Started", "Setting", "Moving",
                  "Attempting", "Training", "✔", "Requesting", "Checkpoint", "/", " ", EVENT_MARKER,
                  *"0123456789")
_HELD_PARTIAL_CHARS = 4096



def last_state(line: str) -> str:
    """What a line redrawn with carriage returns finally showed; a tqdm bar as ``desc: 100% 3/3``."""
    prefix = FORWARD_PREFIX.match(line)
    head = prefix[0] if prefix else ""
    states = [state for state in line[len(head):].split("\r") if state.strip()]
    if not states:
        return head.rstrip()
    state = states[-1].rstrip()
    bar = _TQDM_BAR.match(state)
    if bar is not None:
        desc = bar["desc"].rstrip().rstrip(":")
        counts = f"{_whole(bar['done'])}/{_whole(bar['total'])}"
        state = f"{desc}: {bar['pct']} {counts}" if desc else f"{bar['pct']} {counts}"
    return head + state


def _whole(count: str) -> str:
    # tqdm with unit_scale writes 3 as "3.00"
    return re.sub(r"\.0+(?=[kMGTP]?$)", "", count)


class LogView:
    """A text sink for the follower's log cursor that shows the job's own lines.

    Args:
        out: where the shown lines go.
        on_event: called with each progress event found in the log.
        on_line: called with every complete line, colour removed, shown or not (to read a failure's cause); when
            it returns true, what came before the line is written and ``after_write`` is called at once.
        after_write: called once what a piece of the log shows is written (what follows from its lines is said
            after them).
        on_agent_line: called with each line the agent beside the job wrote (taken out of the job's output);
            None: they stay in it.
        raw: show everything, Ray's chatter and the event lines too, as the log has it.
        strip_ansi: remove colour codes (for output that is not a terminal).
        pipe: the output is no terminal: a bar redrawn with carriage returns is written once, as its last state.
        echoed: kinds of events whose own line the follower prints (``stage``, ``report``): a line of the job
            that says the same (``Stage train finished in 3.1s``, ``epoch 1/3: train_loss …``) is left out.
    """

    def __init__(self, out: TextIO, on_event: Callable[[dict], None] | None = None, *, raw: bool = False,
                 strip_ansi: bool = False, on_line: Callable[[str], Any] | None = None,
                 after_write: Callable[[], None] | None = None,
                 on_agent_line: Callable[[str], None] | None = None, pipe: bool = False,
                 echoed: Collection[str] = ()) -> None:
        self.out = out
        self.on_event = on_event or (lambda event: None)
        self.on_line: Callable[[str], Any] = on_line or (lambda line: None)
        self.after_write = after_write or (lambda: None)
        self.on_agent_line = on_agent_line
        self.raw = raw
        self.strip_ansi = strip_ansi
        self.pipe = pipe and not raw  # --raw: the log as written, carriage returns and all
        self.echoed = frozenset(echoed)
        self.hidden_lines = 0
        self._held = ""  # the start of a line not yet complete and not yet shown
        self._warned_by: str | None = None  # the forwarding prefix of a Ray warning just hidden
        self._shown_partial = False  # part of the current line already went out
        self._events_seen: set[str] = set()
        # A line of the job's that the next event may say again: (what it says, the line), held until then.
        self._echo: tuple[tuple[str, str], str] | None = None

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
            plain = ANSI_ESCAPE.sub("", line)
            if self.on_line(plain):
                # Something follows from this line (a wait to name): the lines before it go out first.
                self._emit("".join(shown))
                shown = []
                self.after_write()
            event = self._event_in(line)
            if event is not None:
                self._took_event(event, line + "\n", shown)
                continue
            if self._shown_partial:
                self._shown_partial = False  # its start is already on the screen: the rest goes too
                shown.append(line + "\n")
                continue
            if self.on_agent_line is not None and not self.raw and plain.startswith(OWN_LINE_PREFIX):
                # The agent's own line (a decision, a problem of the record): shown among rayjobs' lines.
                self.hidden_lines += 1
                self._emit("".join(shown))
                shown = []
                self.on_agent_line(plain)
                continue
            if not self.raw and resource_wait_in(plain) is not None:
                self.hidden_lines += 1  # named in rayjobs' words by the judge of the job's waits
                continue
            if self._keep(plain):
                self._show(line, plain, shown)
        if last:
            if self._shown_partial or not self._could_be_hidden(last):
                self._release_echo(shown)
                shown.append(last)
                self._shown_partial = True
            else:
                self._held = last[-_HELD_PARTIAL_CHARS:]
        self._emit("".join(shown))
        self.after_write()
        return len(text)

    def flush(self) -> None:
        """Flush ``out``; a held partial line stays held until its end or :meth:`close`."""
        self.out.flush()

    def close(self) -> None:
        """The log is over: a last line without an end is shown (if it is not hidden)."""
        shown: list[str] = []
        if self._held:
            held, self._held = self._held, ""
            plain = ANSI_ESCAPE.sub("", held)
            self.on_line(plain)
            event = self._event_in(held)
            if event is not None:
                self._took_event(event, held, shown)
            elif self._keep(plain):
                self._show(held, plain, shown, end="")
        self._release_echo(shown)
        self._emit("".join(shown))
        self.out.flush()

    def _took_event(self, event: dict, line: str, shown: list[str]) -> None:
        """An event: what came before it goes out before what it leads to, unless the event says it again."""
        self._events_seen.add(kind_of(event))
        self._warned_by = None
        if self._echo is not None and self._echo[0] == _fact_of(event):
            self._echo = None
            self.hidden_lines += 1
        self._release_echo(shown)
        self._emit("".join(shown))
        shown.clear()
        self.on_event(event)
        if self.raw:
            shown.append(line)
        else:
            self.hidden_lines += 1

    def _show(self, line: str, plain: str, shown: list[str], end: str = "\n") -> None:
        text = last_state(plain) if self.pipe and "\r" in plain else line
        self._release_echo(shown)
        fact = None if self.raw else self._fact_in(plain)
        if fact is not None:
            self._echo = (fact, text + end)
        else:
            shown.append(text + end)

    def _release_echo(self, shown: list[str]) -> None:
        if self._echo is not None:
            shown.append(self._echo[1])
            self._echo = None

    def _fact_in(self, plain: str) -> tuple[str, str] | None:
        """What an event may say again of a line of the job's: ``("stage", "train")``, ``("report", "3")``."""
        body = FORWARD_PREFIX.sub("", plain, count=1)
        if EventKind.STAGE in self.echoed and EventKind.STAGE in self._events_seen:
            match = _STAGE_ECHO.match(body)
            if match is not None:
                return (EventKind.STAGE, match[1])
        if EventKind.REPORT in self.echoed and self._events_seen & {EventKind.TRAIN_START, EventKind.REPORT}:
            match = _EPOCH_ECHO.match(body)
            if match is not None:
                return (EventKind.REPORT, match[1])
        return None

    def _could_be_hidden(self, partial: str) -> bool:
        body = ANSI_ESCAPE.sub("", partial)
        if self.pipe and "\r" in body:
            return True  # a bar: its last state is written when its line ends
        return body.startswith(_MAY_BE_HIDDEN) and "\r" not in body

    def _event_in(self, line: str) -> dict | None:
        if self._shown_partial:
            return None  # the rest of a line already partly shown is the job's output
        return parse_event(ANSI_ESCAPE.sub("", line))

    def _keep(self, plain: str) -> bool:
        """Whether a complete line that is no event is shown."""
        if self.raw:
            return True
        prefix = FORWARD_PREFIX.match(plain)
        prefix_text = prefix[0] if prefix else ""
        body = plain[len(prefix_text):]
        # Python prints the line of source a warning points at under it, indented: whatever that line is.
        source_of_warning = self._warned_by == prefix_text and body.startswith("  ")
        self._warned_by = prefix_text if RAY_WARNING_LINE.search(body) else None
        if source_of_warning or is_ray_chatter(plain):
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


def _fact_of(event: dict) -> tuple[str, str] | None:
    """What an event says that a job's own line may say too (see :meth:`LogView._fact_in`)."""
    if kind_of(event) == EventKind.STAGE and event.get("state") == "end":
        return (EventKind.STAGE, str(event.get("name")))
    if kind_of(event) == EventKind.REPORT:
        epoch = (event.get("metrics") or {}).get("epoch", event.get("iteration"))
        return (EventKind.REPORT, str(int(epoch))) if isinstance(epoch, (int, float)) else None
    return None


def diagnosis_of(progress: RunProgress, failure: FailureReader) -> Diagnosis | None:
    """Why the job failed: what the agent beside it decided (its ``cause`` events); for a job that ran without the
    agent (submitted by other means), the agent's own table read over the same log here."""
    return progress.diagnosis() if progress.decided else failure.diagnose()


def read_job_log(info: dict[str, Any], text: str) -> tuple[RunProgress, FailureReader]:
    """What the end of a job's log says (its progress, the lines that may name why it failed), read after its
    secrets are masked: a failure's evidence is a line of the log, and is printed."""
    from jobs.secrets import job_mask

    return read_log(job_mask(info).mask_text(text))


def read_log(text: str) -> tuple[RunProgress, FailureReader]:
    """What a whole log says: its progress, and the lines that may name why it failed."""
    progress, reader = RunProgress(), FailureReader()
    view = LogView(io.StringIO(), progress.update, on_line=reader.line)
    view.write(text)
    view.close()
    return progress, reader
