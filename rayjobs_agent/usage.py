"""A run's resource use in totals: how the agent's ``resources`` samples (``resources.py``) and its reports' data
waits add up, one rule for the record keeper, ``rayjobs show`` and ``rayjobs ui``.

Standard library only: the client imports it without the sampler.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .vocabulary import EventKind, kind_of
from .wire import CPU_PRICE_ENV_VAR, GPU_PRICE_ENV_VAR
from .wording import sample_amount

# How often the sampler writes a sample unless told otherwise: what an old sample that said not how long it covers
# is taken to cover.
DEFAULT_EVERY_S = 10.0


@dataclass
class ResourceUsage:
    """The totals of a run's ``resources`` events (and of its reports' data waits): one rule for every reader."""

    samples: int = 0
    seconds: float = 0.0
    cpu_core_s: float = 0.0
    gpu_s: float = 0.0
    peak_rss_bytes: int = 0
    peak_gpu_mem_bytes: int = 0
    cpu_sum: float = 0.0
    gpu_util_sum: float = 0.0
    gpu_samples: int = 0
    data_wait_s: float = 0.0
    epoch_s: float = 0.0
    last: dict[str, Any] | None = field(default=None)

    def take(self, event: Mapping[str, Any]) -> None:
        """Add one event: a ``resources`` sample, or a ``report`` whose metrics say how long it waited for data."""
        kind = kind_of(dict(event))
        if kind == EventKind.REPORT:
            metrics = event.get("metrics")
            if not isinstance(metrics, Mapping):
                return
            wait, epoch = metrics.get("data_wait_s"), metrics.get("epoch_s")
            if sample_amount(wait) and sample_amount(epoch) and epoch > 0:
                self.data_wait_s += float(wait)
                self.epoch_s += float(epoch)
            return
        if kind != EventKind.RESOURCES or not sample_amount(event.get("cpu")):
            return
        # The seconds this sample covers and the CPU·s used in them; an older sample, which said neither, is taken
        # to cover its interval at the mean it gives.
        seconds = event.get("interval_s") if sample_amount(event.get("interval_s")) else \
            event.get("every_s") if sample_amount(event.get("every_s")) else DEFAULT_EVERY_S
        self.samples += 1
        self.seconds += float(seconds)
        self.cpu_sum += float(event["cpu"])
        self.cpu_core_s += float(event["cpu_s"]) if sample_amount(event.get("cpu_s")) else float(event["cpu"]) * seconds
        if sample_amount(event.get("rss_bytes")):
            self.peak_rss_bytes = max(self.peak_rss_bytes, int(event["rss_bytes"]))
        if sample_amount(event.get("gpus")) and event["gpus"] > 0:
            self.gpu_s += float(event["gpus"]) * seconds
            self.gpu_samples += 1
            self.gpu_util_sum += float(event["gpu_util"]) if sample_amount(event.get("gpu_util")) else 0.0
            if sample_amount(event.get("gpu_mem_bytes")):
                self.peak_gpu_mem_bytes = max(self.peak_gpu_mem_bytes, int(event["gpu_mem_bytes"]))
        self.last = dict(event)

    def as_dict(self) -> dict[str, Any]:
        """What ``run.json`` keeps of an attempt's resource use (``resources``)."""
        return {"samples": self.samples, "seconds": round(self.seconds, 3),
                "cpu_core_s": round(self.cpu_core_s, 3), "gpu_s": round(self.gpu_s, 3),
                "peak_rss_bytes": self.peak_rss_bytes, "peak_gpu_mem_bytes": self.peak_gpu_mem_bytes,
                "cpu_sum": round(self.cpu_sum, 3), "gpu_util_sum": round(self.gpu_util_sum, 1),
                "gpu_samples": self.gpu_samples, "data_wait_s": round(self.data_wait_s, 3),
                "epoch_s": round(self.epoch_s, 3)}

    @classmethod
    def from_dict(cls, kept: Mapping[str, Any] | None) -> ResourceUsage:
        """The totals an attempt's ``resources`` in ``run.json`` kept (empty for a record without them)."""
        usage = cls()
        for name in ("samples", "seconds", "cpu_core_s", "gpu_s", "peak_rss_bytes", "peak_gpu_mem_bytes",
                     "cpu_sum", "gpu_util_sum", "gpu_samples", "data_wait_s", "epoch_s"):
            value = (kept or {}).get(name)
            if sample_amount(value):
                setattr(usage, name, type(getattr(usage, name))(value))
        return usage

    def add(self, other: ResourceUsage) -> ResourceUsage:
        """These totals and ``other``'s together (a run's attempts)."""
        total = ResourceUsage()
        for name in ("samples", "seconds", "cpu_core_s", "gpu_s", "cpu_sum", "gpu_util_sum", "gpu_samples",
                     "data_wait_s", "epoch_s"):
            setattr(total, name, getattr(self, name) + getattr(other, name))
        total.peak_rss_bytes = max(self.peak_rss_bytes, other.peak_rss_bytes)
        total.peak_gpu_mem_bytes = max(self.peak_gpu_mem_bytes, other.peak_gpu_mem_bytes)
        total.last = other.last or self.last
        return total

    def totals(self, prices: Mapping[str, float | None] | None = None) -> dict[str, Any]:
        """CPU·hours, GPU·hours, peak memory, mean use, the share of training spent waiting for data, and the cost
        at ``prices`` (``cpu_hour``, ``gpu_hour``; None where a price is missing)."""
        cpu_hours = self.cpu_core_s / 3600
        gpu_hours = self.gpu_s / 3600
        cost = None
        prices = prices or {}
        cpu_price, gpu_price = prices.get("cpu_hour"), prices.get("gpu_hour")
        if cpu_price is not None and (gpu_price is not None or not self.gpu_s):
            cost = cpu_hours * cpu_price + gpu_hours * (gpu_price or 0.0)
        return {"samples": self.samples, "cpu_hours": cpu_hours, "gpu_hours": gpu_hours,
                "peak_rss_bytes": self.peak_rss_bytes, "peak_gpu_mem_bytes": self.peak_gpu_mem_bytes,
                "mean_cpu": _share(self.cpu_core_s, self.seconds),
                "mean_gpu_util": _share(self.gpu_util_sum, self.gpu_samples),
                "data_wait_share": _share(self.data_wait_s, self.epoch_s), "cost": cost}


def _share(part: float, whole: float) -> float | None:
    """``part / whole``; None where it is no number to show (no whole, or one so small the share is infinite, as
    only a record written by hand holds)."""
    if not whole:
        return None
    try:
        share = part / whole
    except OverflowError:
        return None
    return share if math.isfinite(share) else None


def resource_totals(events: Iterable[Mapping[str, Any]], prices: Mapping[str, float | None] | None = None
                    ) -> dict[str, Any]:
    """The totals (:meth:`ResourceUsage.totals`) of a run's events."""
    usage = ResourceUsage()
    for event in events:
        usage.take(event)
    return usage.totals(prices)


def prices_from(environ: Mapping[str, str]) -> dict[str, float | None]:
    """The prices per CPU core·hour and per GPU·hour the environment gives (None where it gives none)."""
    prices: dict[str, float | None] = {}
    for key, variable in (("cpu_hour", CPU_PRICE_ENV_VAR), ("gpu_hour", GPU_PRICE_ENV_VAR)):
        try:
            prices[key] = float(environ[variable]) if environ.get(variable) else None
        except ValueError:
            raise ValueError(f"{variable} must be a number (a price per hour), not {environ[variable]!r}") from None
    return prices


__all__ = ["DEFAULT_EVERY_S", "ResourceUsage", "prices_from", "resource_totals"]
