"""Schedule settings: an interval or a crontab, read as an APScheduler trigger (kernel: settings validate with it).

The reindex scheduler that runs them is :mod:`quarry.scheduler`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd]?)\Z")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}

def parse_schedule(text: str) -> BaseTrigger | None:
    """An APScheduler trigger from a schedule setting; ``None`` for ``""`` or ``off``.

    Args:
        text: An interval (``90s``, ``30m``, ``6h``, ``1d``, or plain seconds) or a five-field
            crontab (``minute hour day month weekday``), read in UTC.

    Raises:
        ValueError: Neither (pydantic reports it as the setting's validation error).
    """
    value = text.strip()
    if not value or value.lower() == "off":
        return None
    match = _INTERVAL.match(value.lower())
    if match:
        seconds = float(match[1]) * _UNIT_S[match[2]]
        if seconds <= 0:
            raise ValueError(f"schedule {value!r}: an interval must be positive")
        return IntervalTrigger(seconds=seconds, timezone=UTC)
    try:
        return CronTrigger.from_crontab(value, timezone=UTC)
    except ValueError as exc:
        raise ValueError(
            f"schedule {value!r} is neither an interval (90s, 30m, 6h, 1d) nor a five-field crontab: {exc}"
        ) from exc


def period_s(trigger: BaseTrigger, now: datetime | None = None) -> float:
    """Seconds between the trigger's next two fire times after ``now`` (a crontab's may vary)."""
    now = now or datetime.now(UTC)
    first = trigger.get_next_fire_time(None, now)
    if first is None:
        return float("inf")
    second = trigger.get_next_fire_time(first, first + timedelta(microseconds=1))
    return float("inf") if second is None else (second - first).total_seconds()
