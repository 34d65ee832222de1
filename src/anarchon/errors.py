"""Errors raised by anarchon.

Every error anarchon raises derives from :class:`AnarchonError`. Errors about a value the caller
got wrong also derive from :class:`ValueError`, lookups from :class:`LookupError`, so generic
handlers keep working::

    AnarchonError
    ├── ConfigurationError (ValueError)      a value or option breaks a rule
    │   ├── InvalidSchedule                   bad cron expression (names the field)
    │   ├── InvalidTimezone                   not an IANA time zone
    │   ├── InvalidJobName                    outside [A-Za-z0-9_-]{1,128}
    │   ├── InvalidOption                     a limit out of range, options that contradict
    │   ├── DuplicateJob                      two jobs with one name
    │   └── UnsupportedFeature                the backend lacks a feature the job asks for
    ├── JobNotFound (LookupError)             no job with that name on this scheduler
    ├── SchedulerStateError (RuntimeError)    run_now() before start(), add() after stop()
    ├── MissingDependency (ImportError)       a backend's extra is not installed
    └── BackendError                          the backend failed or refused
        ├── BackendUnavailable                cannot reach it now; retried with backoff
        └── LeaseLost                         a newer attempt holds the run; result refused
"""

from __future__ import annotations

__all__ = [
    "AnarchonError",
    "BackendError",
    "BackendUnavailable",
    "ConfigurationError",
    "DuplicateJob",
    "InvalidJobName",
    "InvalidOption",
    "InvalidSchedule",
    "InvalidTimezone",
    "JobNotFound",
    "LeaseLost",
    "MissingDependency",
    "SchedulerStateError",
    "UnsupportedFeature",
]


class AnarchonError(Exception):
    """Root of every error anarchon raises."""


class ConfigurationError(AnarchonError, ValueError):
    """A value given to anarchon breaks one of its rules; the message names both."""


class InvalidSchedule(ConfigurationError):
    """A cron expression anarchon cannot use; the message names the field at fault."""


class InvalidTimezone(ConfigurationError):
    """A time zone that is not a known IANA name, such as ``Europe/Athens``."""


class InvalidJobName(ConfigurationError):
    """A job name outside ``[A-Za-z0-9_-]``, empty, or longer than 128 characters."""


class InvalidOption(ConfigurationError):
    """An option out of its range, or options that contradict each other."""


class DuplicateJob(ConfigurationError):
    """A job with this name is already registered on the scheduler."""


class UnsupportedFeature(ConfigurationError):
    """The job asks for a feature its backend does not have (for example a lease on NATS)."""


class JobNotFound(AnarchonError, LookupError):
    """No job with this name is registered on this scheduler."""


class SchedulerStateError(AnarchonError, RuntimeError):
    """The scheduler is not in a state that allows the call (not started, already stopped)."""


class MissingDependency(AnarchonError, ImportError):
    """A backend's optional dependency is not installed; the message names the extra."""


class BackendError(AnarchonError):
    """The backend failed or refused an operation."""


class BackendUnavailable(BackendError):
    """The backend cannot be reached now. Claims fail closed; the scheduler retries."""


class LeaseLost(BackendError):
    """The run's lease was taken over or released: a newer attempt holds it, this one is refused."""
