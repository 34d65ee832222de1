"""anarchon for Django: settings, jobs in each app's ``cron.py``, and ``manage.py anarchon``.

Add the app and say where claims and history live::

    INSTALLED_APPS = [..., "anarchon.integrations.django"]
    ANARCHON = {"database": "default"}          # reuse a PostgreSQL database of DATABASES
    # or ANARCHON = {"backend": "redis://cache:6379/0?prefix=myapp:"}

Declare jobs in any installed app's ``cron.py``::

    from anarchon.integrations.django import job

    @job("cleanup", "0 3 * * *")
    def cleanup(ctx):
        Session.objects.filter(expire_date__lt=timezone.now()).delete()

and run ``python manage.py anarchon run`` in as many processes (pods, hosts) as you like: each
slot runs on one of them. Around every run the handler's stale database connections are closed,
as Django does around every request.

Settings (``ANARCHON``, a dict; every key optional):

``backend``
    a backend URL (``sqlite:////abs/path.db``, ``postgresql://...``, ``redis://...``,
    ``nats://...``). Default: ``$ANARCHON_BACKEND``, else SQLite in ``./anarchon.db``.
``database``
    instead of ``backend``: the alias of a PostgreSQL database in ``DATABASES`` whose settings
    the PostgreSQL backend reuses: it connects with the parameters Django connects with
    (password included, never printed).
``backend_options``
    with ``database``: the PostgreSQL backend's options (``schema``, ``table_prefix``,
    ``notifications``, ``prepared_statements``, ``max_connections`` ...).
``timezone``
    the zone of jobs that name none. Default: ``TIME_ZONE``.
``grace_ms``, ``max_workers``, ``instance_id``
    the :class:`~anarchon.Scheduler`'s options.

Every key is checked when Django starts (:func:`check_settings`), without connecting anywhere.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlencode
from zoneinfo import ZoneInfo

from anarchon import (
    ConfigurationError,
    CronSchedule,
    MissingDependency,
    RunContext,
    Scheduler,
    backend_from_url,
)
from anarchon._job import is_async

try:
    from django.core.exceptions import ImproperlyConfigured as DjangoImproperlyConfigured
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingDependency(
        f"anarchon.integrations.django needs Django ({exc}); install it with "
        "pip install 'anarchon[django]'"
    ) from exc

__all__ = [
    "ImproperlyConfigured",
    "JobSpec",
    "backend_url",
    "build_scheduler",
    "job",
    "registered_jobs",
]

H = TypeVar("H", bound=Callable[[RunContext], Any])

SETTING: Final = "ANARCHON"
ENV_BACKEND: Final = "ANARCHON_BACKEND"
CRON_MODULE: Final = "cron"
KEYS: Final = frozenset(
    {"backend", "database", "backend_options", "timezone", "grace_ms", "max_workers", "instance_id"}
)
SCHEDULER_KEYS: Final = ("grace_ms", "max_workers", "instance_id")
# Django's own OPTIONS of a PostgreSQL database: not connection parameters for libpq.
DJANGO_ONLY_OPTIONS: Final = frozenset(
    {
        "assume_role",
        "context",
        "cursor_factory",
        "isolation_level",
        "pool",
        "prepare_threshold",
        "server_side_binding",
    }
)


class ImproperlyConfigured(ConfigurationError, DjangoImproperlyConfigured):
    """The ``ANARCHON`` setting (or the database it names) breaks a rule; the message names the
    key, the value and the rule. Both anarchon's :class:`~anarchon.ConfigurationError` (the
    ``anarchon`` command prints it on one line, exit code 2) and Django's own."""


@dataclass(frozen=True)
class JobSpec:
    """A job declared with :func:`job`, added to the scheduler by :func:`build_scheduler`."""

    name: str
    """The job's name."""
    schedule: str
    """The job's schedule, a cron expression as :meth:`anarchon.Scheduler.add` takes it."""
    handler: Callable[[RunContext], Any]
    """The decorated function: the job's handler."""
    options: Mapping[str, Any]
    """The other keyword arguments given to :func:`job`, passed on to
    :meth:`anarchon.Scheduler.add`."""


_REGISTRY: list[JobSpec] = []


def job(name: str, schedule: str, **options: Any) -> Callable[[H], H]:
    """Declare a job (in an app's ``cron.py``); returns the handler unchanged.

    Takes the options of :meth:`anarchon.Scheduler.add` (``timezone``, ``max_late_ms``,
    ``timeout_ms``, ``overlap`` ...); they are checked when the scheduler is built. A job
    without ``timezone`` runs in ``ANARCHON["timezone"]``, else Django's ``TIME_ZONE``.
    """

    def register(handler: H) -> H:
        _REGISTRY.append(JobSpec(name, schedule, handler, dict(options)))
        return handler

    return register


def registered_jobs() -> list[JobSpec]:
    """Every job declared so far, in the order declared (import the ``cron`` modules first:
    :func:`build_scheduler` does)."""
    return list(_REGISTRY)


def _settings() -> dict[str, Any]:
    from django.conf import settings

    value = getattr(settings, SETTING, None)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(f"settings.{SETTING} = {value!r} must be a dict")
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.{SETTING} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"the keys are {', '.join(sorted(KEYS))}"
        )
    if "backend" in value and "database" in value:
        raise ImproperlyConfigured(
            f"settings.{SETTING} names both 'backend' and 'database'; give one: a backend URL, "
            "or the alias of a PostgreSQL database in DATABASES to reuse"
        )
    if "backend_options" in value and "database" not in value:
        raise ImproperlyConfigured(
            f"settings.{SETTING}['backend_options'] applies only with 'database'; with "
            "'backend' put the options in the URL's query (?schema=...)"
        )
    return dict(value)


def check_settings() -> None:
    """Check every key of the ``ANARCHON`` setting as ``manage.py anarchon run`` takes it, with
    the same messages, and connect to nothing: the backend is made from its URL but not
    started, the scheduler made without jobs. Done when Django starts, by the app's
    ``ready()``, so a mistake stops every process (web workers too) at once. A backend client
    that is not installed (``nats-py`` for a ``nats://`` URL) is not a mistake here: a web
    image may leave it out, since the scheduler runs in ``manage.py anarchon run``, which
    refuses to start without it."""
    _scheduler(missing_client_ok=True)


def backend_url() -> str | None:
    """The backend URL the settings name: ``ANARCHON["backend"]``, the URL of the PostgreSQL
    database ``ANARCHON["database"]`` (with its password: never print it), else
    ``$ANARCHON_BACKEND``, else None (SQLite in ``./anarchon.db``)."""
    config = _settings()
    if "database" in config:
        return _database_url(config["database"], config.get("backend_options") or {})
    backend = config.get("backend")
    if backend is not None:
        if not isinstance(backend, str) or not backend.strip():
            raise ImproperlyConfigured(
                f"settings.{SETTING}['backend'] = {backend!r} must be a backend URL such as "
                "'postgresql://db/app' or 'sqlite:////srv/app/anarchon.db'"
            )
        return backend
    return os.environ.get(ENV_BACKEND) or None


def _database_url(alias: object, options: object) -> str:
    """A ``postgresql://`` URL with the connection settings of ``DATABASES[alias]``."""
    from django.db import connections

    if not isinstance(alias, str) or alias not in connections.settings:
        known = ", ".join(repr(a) for a in connections.settings)
        raise ImproperlyConfigured(
            f"settings.{SETTING}['database'] = {alias!r} is not a database of DATABASES "
            f"(they are {known})"
        )
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(
            f"settings.{SETTING}['backend_options'] = {options!r} must be a dict"
        )
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] is a {connection.vendor} database; anarchon reuses only "
            f"PostgreSQL databases. Set settings.{SETTING}['backend'] to a URL instead, for "
            "example 'sqlite:////srv/app/anarchon.db' (an absolute path shared by every process)"
        )
    query = _connection_params(alias, connection.settings_dict)
    for key, value in options.items():
        query[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    # Every parameter in the query (the URL has no host part), each value percent-encoded
    # (quote, not urlencode's default quote_plus: libpq reads a '+' as a plus, never as a
    # space), so a socket folder or an IPv6 address for a host, a list of hosts, a database
    # name with '/' all reach libpq as Django gives them.
    return f"postgresql://?{urlencode(query, quote_via=quote)}"


def _connection_params(alias: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """The libpq parameters Django connects to ``DATABASES[alias]`` with, as text: what its
    PostgreSQL backend's ``get_connection_params`` hands psycopg, less Django's own keys."""
    params: dict[str, str] = {}
    name = settings.get("NAME")
    options = dict(settings.get("OPTIONS") or {})
    if name is None:  # Django's "the postgres database", whatever a service file says
        options.pop("service", None)
        params["dbname"] = "postgres"
    elif name:
        params["dbname"] = str(name)
    for key, value in options.items():  # after NAME: a dbname in OPTIONS wins, as in Django
        if key in DJANGO_ONLY_OPTIONS or value is None:  # psycopg drops a None
            continue
        if not isinstance(value, bool | int | float | str):
            raise ImproperlyConfigured(
                f"DATABASES[{alias!r}]['OPTIONS'][{key!r}] is a {type(value).__name__}; anarchon "
                "passes only text and numbers on to libpq. Give the PostgreSQL backend its own "
                f"URL in settings.{SETTING}['backend']"
            )
        params[str(key)] = str(value)
    params["client_encoding"] = "UTF8"
    for key in ("USER", "PASSWORD", "HOST", "PORT"):
        if settings.get(key):
            params[key.lower()] = str(settings[key])
    return params


def _with_connections(handler: Callable[[RunContext], Any]) -> Callable[[RunContext], Any]:
    """Wrap a handler so the database connections of the thread it runs on are closed when
    stale (``CONN_MAX_AGE`` over, broken, left in a transaction) before and after each run, as
    Django does around each request."""
    from django.db import close_old_connections

    if is_async(handler):  # as the scheduler tells: also a partial or an async __call__
        from asgiref.sync import sync_to_async

        # Async ORM calls run on asgiref's thread-sensitive thread: close connections there.
        close_async = sync_to_async(close_old_connections)
        run_async: Callable[[RunContext], Awaitable[Any]] = handler

        @functools.wraps(handler)
        async def around_async(ctx: RunContext) -> Any:
            await close_async()
            try:
                return await run_async(ctx)
            finally:
                await close_async()

        return around_async

    @functools.wraps(handler)
    def around(ctx: RunContext) -> Any:
        close_old_connections()
        try:
            return handler(ctx)
        finally:
            close_old_connections()

    return around


def build_scheduler() -> Scheduler:
    """A :class:`~anarchon.Scheduler` made from the settings, with every job of every installed
    app's ``cron`` module. Jobs are checked here: a bad one raises the error that names it."""
    from django.utils.module_loading import autodiscover_modules

    scheduler, zone = _scheduler()
    autodiscover_modules(CRON_MODULE)
    for spec in _REGISTRY:
        scheduler.add(
            spec.name,
            spec.schedule,
            _with_connections(spec.handler),
            **{"timezone": zone, **spec.options},
        )
    return scheduler


def _scheduler(missing_client_ok: bool = False) -> tuple[Scheduler, str | ZoneInfo]:
    """The scheduler the settings make, with no job yet, and the zone of jobs that name none.
    A value anarchon refuses is :class:`ImproperlyConfigured`, its message naming where the
    value came from; nothing is connected to. ``missing_client_ok``: a backend whose client
    is not installed is left out (the SQLite default stands in to check the other keys)."""
    from django.conf import settings

    config = _settings()
    url = backend_url()
    if "database" in config:
        source = f"settings.{SETTING}['database'] = {config['database']!r}"
    else:
        source = f"settings.{SETTING}['backend']" if "backend" in config else f"${ENV_BACKEND}"
    try:
        backend = backend_from_url(url) if url else None
    except MissingDependency as exc:
        if not missing_client_ok:
            raise ImproperlyConfigured(f"{source}: {exc}") from exc
        backend = None
    except ConfigurationError as exc:
        raise ImproperlyConfigured(f"{source}: {exc}") from exc
    zone = config.get("timezone")
    if zone is None:
        zone = getattr(settings, "TIME_ZONE", None) or "UTC"
    try:
        CronSchedule("* * * * *", zone)  # the zone checked as Scheduler.add checks a job's
        options = {key: config[key] for key in SCHEDULER_KEYS if key in config}
        return Scheduler(backend, **options), zone
    except ConfigurationError as exc:
        raise ImproperlyConfigured(f"settings.{SETTING}: {exc}") from exc
