"""A maintenance window's cron, read by APScheduler: the one place that turns `cron` and
`timezone` into a trigger, used by the config's checks, the scheduler and `sparkd windows`."""

from __future__ import annotations

from apscheduler.triggers.cron import CronTrigger

from sparkd.model.cluster import MaintenanceSpec


def cron_trigger(spec: MaintenanceSpec) -> CronTrigger:
    """APScheduler's trigger for the window's starts; raises ValueError when invalid."""
    try:
        return CronTrigger.from_crontab(spec.cron, timezone=spec.timezone)
    except ValueError as exc:
        raise ValueError(f"cron {spec.cron!r}: {exc}") from None
    except LookupError as exc:  # an unknown timezone name
        raise ValueError(f"unknown timezone {spec.timezone!r}: {exc}") from None
