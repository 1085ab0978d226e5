"""A KubeRay ``RayCronJob``: the RayJob of ``export kuberay`` run on a cron schedule (``--schedule``).

The operator parses the schedule with robfig/cron's standard parser and the time zone with Go's
``time.LoadLocation``, and it does so only once the manifest is applied: a bad schedule shows up as
an event on the RayCronJob and no job ever runs. So both are checked here, before anything is
written, by the same rules: five fields, each a number, a range, a step or a list of them, months and
weekdays also by name, and a time zone of the IANA database.
"""

from __future__ import annotations

import copy
import difflib
import re
import zoneinfo
from dataclasses import dataclass
from typing import Any

import yaml

from rayjobs_agent.wire import RUN_PER_SUBMISSION_ENV_VAR
from runner.errors import BadInput
from runner.export.kuberay import Export

RAYCRONJOB_KIND = "RayCronJob"
FEATURE_GATE = "RayCronJob"  # off by default in KubeRay v1.7

MONTHS = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
WEEKDAYS = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}


@dataclass(frozen=True)
class CronField:
    """One of the five fields of a schedule: its name, its bounds, and the names it takes for numbers."""

    name: str
    low: int
    high: int
    names: dict[str, int]
    hint: str
    named: str = ""  # what its names are, for a message


FIELDS = (
    CronField("minute", 0, 59, {}, "0-59"),
    CronField("hour", 0, 23, {}, "0-23"),
    CronField("day of month", 1, 31, {}, "1-31"),
    CronField("month", 1, 12, MONTHS, "1-12 or JAN-DEC", "a month's first three letters (JAN-DEC)"),
    CronField("day of week", 0, 6, WEEKDAYS, "0-6 or SUN-SAT, 0 is Sunday", "a day's first three letters (SUN-SAT)"),
)
ORDINALS = ("1st", "2nd", "3rd", "4th", "5th")
SYNTAX = ("A schedule is five fields separated by spaces: minute (0-59), hour (0-23), day of month (1-31), "
          "month (1-12 or JAN-DEC) and day of week (0-6 or SUN-SAT, 0 is Sunday). Each field is * (every), a "
          "number, a range (1-5), a step (*/15, 0-30/5) or a comma-separated list of them (1,15). For example "
          "\"0 3 * * *\" runs every day at 03:00, and \"30 6 * * mon-fri\" at 06:30 on weekdays.")
# What robfig/cron reads for these descriptors; KubeRay accepts them, five fields say the same plainly.
DESCRIPTORS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
               "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
ITEM = re.compile(r"^(?P<range>\*|\?|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(?P<step>[^/]*))?$", re.IGNORECASE)


def check_schedule(schedule: str) -> str:
    """The schedule as the manifest will carry it (spaces tidied), or BadInput saying what is wrong and why."""
    fields = schedule.split()
    if not fields:
        raise _refused(schedule, "it is empty")
    if any("TZ" in field for field in fields):
        raise _refused(schedule, "KubeRay takes no TZ= or CRON_TZ= in the schedule: give --time-zone instead")
    if fields[0].startswith("@"):
        equivalent = DESCRIPTORS.get(fields[0].lower())
        reason = (f"{fields[0]} is \"{equivalent}\" in five fields: give that" if equivalent and len(fields) == 1
                  else f"{fields[0]} is not one of the five fields")
        raise _refused(schedule, reason)
    if len(fields) != len(FIELDS):
        raise _refused(schedule, f"it has {len(fields)} field{'s' if len(fields) != 1 else ''}, not 5"
                       + (" (a leading seconds field is not taken)" if len(fields) == 6 else ""))
    for position, (text, field) in enumerate(zip(fields, FIELDS)):
        problem = _field_problem(text, field)
        if problem:
            raise _refused(schedule, f"the {field.name} field ({ORDINALS[position]}), {text!r}, {problem}")
    return " ".join(fields)


def _field_problem(text: str, field: CronField) -> str | None:
    """Why ``text`` is not a valid ``field``, or None."""
    for item in text.split(","):
        if not item:
            return "has an empty item in its list"
        match = ITEM.match(item)
        if match is None:
            return f"is not a number, a range, a step or a list of them ({field.hint})"
        if match["step"] is not None:
            if not match["step"].isdigit() or int(match["step"]) == 0:
                return f"has a step of {match['step']!r}: a step is a whole number from 1"
        if match["range"] in ("*", "?"):
            continue
        bounds = match["range"].split("-")
        values = []
        for bound in bounds:
            value = _value(bound, field)
            if value is None:
                named = f" or {field.named}" if field.named else ""
                return f"has {bound!r}, which is not a number{named}"
            if not field.low <= value <= field.high:
                extra = " (Sunday is 0)" if field.names is WEEKDAYS and value == 7 else ""
                return f"has {bound}, outside {field.low}-{field.high}{extra}"
            values.append(value)
        if len(values) == 2 and values[0] > values[1]:
            return f"has the range {match['range']}, which runs backwards"
    return None


def _value(bound: str, field: CronField) -> int | None:
    if bound.isdigit():
        return int(bound)
    return field.names.get(bound.lower())  # names are read in any case, as robfig/cron does


def _refused(schedule: str, reason: str) -> BadInput:
    return BadInput(f"--schedule {schedule!r} is not a schedule KubeRay runs: {reason}. {SYNTAX}")


def check_time_zone(name: str) -> str | None:
    """Raise BadInput unless ``name`` is a zone of the IANA database; a note when it cannot be checked here."""
    if name in ("Local", "") or name != name.strip():
        raise BadInput(f"--time-zone {name!r} is not a time zone KubeRay takes: give an IANA name such as "
                       "Europe/Paris or UTC, or leave --time-zone out to use the time zone of the operator's pod")
    try:
        zoneinfo.ZoneInfo(name)
        return None
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones, such as "Europe"
        pass
    known = zoneinfo.available_timezones()
    if not known:
        return (f"--time-zone {name} was not checked: this machine has no time zone database (install tzdata); "
                "the operator refuses an unknown zone when the manifest is applied")
    close = difflib.get_close_matches(name, sorted(zone for zone in known if "/" in zone or zone == "UTC"), n=3)
    suggestion = f" Did you mean {' or '.join(close)}?" if close else ""
    raise BadInput(f"--time-zone {name!r} is not a time zone of the IANA database, so KubeRay would refuse the "
                   f"RayCronJob: give a name such as Europe/Paris, America/New_York or UTC.{suggestion}")


def build_raycronjob(rayjob: Export, schedule: str, time_zone: str | None) -> Export:
    """A RayCronJob that creates the RayJob of ``rayjob`` on ``schedule``, in ``time_zone`` if given.

    ``schedule`` and ``time_zone`` must have passed :func:`check_schedule` and :func:`check_time_zone`.
    The RayJob's notes and warnings carry over, with what scheduling adds to them.
    """
    template = copy.deepcopy(rayjob.manifest["spec"])
    result = Export({}, list(rayjob.notes), list(rayjob.warnings))
    # Each scheduled run is a new run, as a rerun is: its workload and its record name their folder after its
    # submission, so that no run resumes the previous one's checkpoint or writes into its record.
    runtime_env = yaml.safe_load(template.get("runtimeEnvYAML") or "") or {}
    runtime_env.setdefault("env_vars", {})[RUN_PER_SUBMISSION_ENV_VAR] = "1"
    template["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=False, default_flow_style=False, width=2**20)
    result.notes.append("each scheduled run is a new run: its run folder (and its MLflow run) is named after its "
                        "submission")
    if template.pop("suspend", False):
        # The RayCronJob controller labels a RayJob it creates with its own name only: Kueue never sees it.
        result.warnings.append("Kueue does not queue the scheduled runs: the RayCronJob gives the RayJobs it creates "
                               "none of its labels, so each is created unsuspended and starts at once")
    if "jobId" in template:
        # Ray refuses a submission id it already holds, and the run record is named after it.
        result.warnings.append(f"submission_id ({template.pop('jobId')}) is dropped: every scheduled run would "
                               "send the same id; each run gets an id of its own")
    result.notes.append(f"a {RAYCRONJOB_KIND} runs only where KubeRay's operator has its {FEATURE_GATE} feature gate "
                        f"on (v1.7: --feature-gates={FEATURE_GATE}=true); each run is a RayJob of its own")
    spec: dict[str, Any] = {"schedule": schedule}
    if time_zone is not None:
        spec["timeZone"] = time_zone
    else:
        result.notes.append("no --time-zone: the schedule runs in the time zone of the operator's pod")
    spec["jobTemplate"] = template
    result.manifest = {"apiVersion": rayjob.manifest["apiVersion"], "kind": RAYCRONJOB_KIND,
                       "metadata": copy.deepcopy(rayjob.manifest["metadata"]), "spec": spec}
    return result
