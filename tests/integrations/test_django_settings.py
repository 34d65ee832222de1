"""anarchon.integrations.django in one process: the URL built from Django's database settings,
the job registry and defaults, and the connection handling around each run."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import django
import psycopg
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import ConnectionHandler
from django.test import override_settings
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from anarchon import (
    ConfigurationError,
    PostgresBackend,
    RunContext,
    RunStatus,
    Scheduler,
    backend_from_url,
)
from anarchon.backends.postgres._options import split_url

SECRET = "s3cr3t-Pa55"

DATABASES: dict[str, dict[str, Any]] = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "app db",
        "USER": "app",
        "PASSWORD": SECRET,
        "HOST": "db.internal",
        "PORT": 6432,
        "OPTIONS": {"sslmode": "require", "isolation_level": 1, "application_name": "web"},
    },
    "socket": {"ENGINE": "django.db.backends.postgresql", "NAME": None},
}


@pytest.fixture(scope="module", autouse=True)
def django_settings() -> None:
    if not settings.configured:
        settings.configure(
            DATABASES=DATABASES,
            INSTALLED_APPS=["anarchon.integrations.django"],
            USE_TZ=True,
            TIME_ZONE="Europe/Athens",
        )
        django.setup()


@pytest.fixture
def registry() -> Iterator[list[Any]]:
    from anarchon.integrations import django as integration

    saved = list(integration._REGISTRY)
    integration._REGISTRY.clear()
    try:
        yield integration._REGISTRY
    finally:
        integration._REGISTRY[:] = saved


def test_the_postgres_backend_reuses_a_django_database_and_never_shows_its_password() -> None:
    from anarchon.integrations.django import backend_url, build_scheduler

    options = {"schema": "cron", "notifications": False}
    with override_settings(ANARCHON={"database": "pg", "backend_options": options}):
        url = backend_url()
        scheduler = build_scheduler()
    assert url is not None
    libpq = conninfo_to_dict(split_url(url)[0])
    assert {k: libpq[k] for k in ("dbname", "user", "host", "port", "password")} == {
        "dbname": "app db",
        "user": "app",
        "host": "db.internal",
        "port": "6432",
        "password": SECRET,
    }
    assert (libpq["sslmode"], libpq["application_name"]) == ("require", "web")
    assert "isolation_level" not in url and "schema=cron" in url
    backend = scheduler.backend
    assert isinstance(backend, PostgresBackend)
    assert (backend.schema, backend.notifications) == ("cron", False)
    assert SECRET not in repr(backend) and "db.internal:6432/app db" in repr(backend)
    # NAME None is Django's "connect to the postgres database"; no HOST: libpq's default socket.
    with override_settings(ANARCHON={"database": "socket"}):
        libpq = conninfo_to_dict(split_url(backend_url() or "")[0])
    assert libpq == {"dbname": "postgres", "client_encoding": "UTF8"}


# What psycopg takes beside the conninfo: Django's get_connection_params hands these on too.
PSYCOPG_ONLY = ("context", "cursor_factory", "prepare_threshold")

# Settings of a PostgreSQL database whose parts a URL must escape: spaces ('+' is a plus to
# libpq), '@', ':', '/', '?', '&', '=', '%', '#', non-ASCII text, a socket folder, an IPv6
# address, a list of hosts, a service file, Django's own options and a None.
ROUND_TRIPS: dict[str, dict[str, Any]] = {
    "spaces": {
        "NAME": "test",
        "USER": "postgres",
        "PASSWORD": "correct horse",
        "HOST": "127.0.0.1",
        "PORT": 5432,
        "OPTIONS": {"options": "-c search_path=public", "application_name": "my site"},
    },
    "specials": {
        "NAME": "my db/x?y&z=1#f",
        "USER": "a@b:c d",
        "PASSWORD": "p@ss:w/rd?&=+%20#'\\ pässwörd",
        "HOST": "db.internal",
        "PORT": "6432",
        "OPTIONS": {"sslmode": "require", "connect_timeout": 5, "sslrootcert": None},
    },
    "socket": {
        "NAME": "app",
        "HOST": "/var/run/postgresql",
        "OPTIONS": {"isolation_level": 1, "server_side_binding": True, "pool": {"min_size": 2}},
    },
    "ipv6": {"NAME": "app", "HOST": "::1", "PORT": 5433, "OPTIONS": {"prepare_threshold": 5}},
    "hosts": {"NAME": "app", "HOST": "db1,db2", "PORT": "5432,5433", "USER": "u"},
    "default-db": {"NAME": None, "OPTIONS": {"service": "dropped", "assume_role": "r"}},
    "service": {"NAME": "", "OPTIONS": {"service": "my service"}},
    "dbname-option": {"NAME": "app", "OPTIONS": {"dbname": "other", "user": "lost"}, "USER": "u"},
}


@contextmanager
def databases(found: dict[str, dict[str, Any]]) -> Iterator[ConnectionHandler]:
    """``django.db.connections`` made of ``found`` (every one a PostgreSQL database) while the
    block runs."""
    import django.db

    engine = {"ENGINE": "django.db.backends.postgresql"}
    made = {alias: {**engine, **given} for alias, given in found.items()}
    handler = ConnectionHandler({"default": DATABASES["default"], **made})
    saved = django.db.connections
    django.db.connections = handler
    try:
        yield handler
    finally:
        django.db.connections = saved


@pytest.mark.parametrize("alias", ROUND_TRIPS)
def test_the_url_gives_libpq_exactly_what_django_connects_with(alias: str) -> None:
    """Before: ``urlencode`` wrote a space as '+', which libpq reads as a plus: a PASSWORD
    'correct horse' became 'correct+horse' and OPTIONS {'options': '-c search_path=public'}
    '-c+search_path=public' (the server refused '+search_path')."""
    from anarchon.integrations.django import backend_url

    with databases(ROUND_TRIPS) as handler:
        django_gives = dict(handler[alias].get_connection_params())
        with override_settings(ANARCHON={"database": alias, "backend_options": {"schema": "s"}}):
            url = backend_url()
    assert url is not None
    dsn, ours = split_url(url)
    assert ours == {"schema": "s"}
    for key in PSYCOPG_ONLY:
        django_gives.pop(key, None)
    libpq = conninfo_to_dict(make_conninfo("", **django_gives))  # what psycopg makes of them
    assert conninfo_to_dict(dsn) == libpq
    if alias == "spaces":
        assert libpq["password"] == "correct horse"
        assert libpq["options"] == "-c search_path=public"
        assert libpq["application_name"] == "my site"


async def test_options_with_spaces_reach_the_real_server() -> None:
    """Before: the backend's connections failed with 'unrecognized configuration parameter
    "+search_path"', so ``manage.py anarchon run`` and every command exited."""
    from anarchon.integrations.django import backend_url
    from tests.backends.postgres import DSN, drop_schema, fresh_schema

    schema = fresh_schema()
    server = conninfo_to_dict(DSN)
    given = {
        "NAME": server.get("dbname", "test"),
        "HOST": server.get("host", "127.0.0.1"),
        "PORT": server.get("port", 5432),
        "PASSWORD": "correct horse",  # not checked under trust authentication
        "OPTIONS": {"options": f"-c search_path={schema}", "application_name": "my site"},
    }
    with (
        databases({"pg": given}),
        override_settings(ANARCHON={"database": "pg", "backend_options": {"schema": schema}}),
    ):
        url = backend_url()
    assert url is not None
    backend = backend_from_url(url)
    scheduler = Scheduler(backend, instance_id="web-1")
    scheduler.add("report", "0 6 * * *", lambda ctx: None)
    try:
        async with scheduler:
            assert (await scheduler.run_now("report")).status == RunStatus.SUCCEEDED
        dsn = split_url(url)[0]
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cursor = await conn.execute("SELECT current_setting('search_path'), "
                                        "current_setting('application_name')")  # fmt: skip
            assert await cursor.fetchone() == (schema, "my site")
    finally:
        await drop_schema(schema)


def test_settings_mistakes_name_the_key_and_the_rule() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from anarchon.integrations.django import backend_url, check_settings

    cases: dict[str, Any] = {
        "must be a dict": ["backend"],
        "unknown key(s) 'jitter'": {"jitter": 1},
        "is a sqlite database": {"database": "default"},
        "'nope' is not a database of DATABASES (they are 'default', 'pg', 'socket')": {
            "database": "nope"
        },
        "applies only with 'database'": {"backend": "memory://", "backend_options": {}},
        "must be a backend URL": {"backend": 5},
    }
    for message, value in cases.items():
        with override_settings(ANARCHON=value), pytest.raises(ConfigurationError) as caught:
            check_settings()
            backend_url()
        assert message in str(caught.value)
        assert isinstance(caught.value, ImproperlyConfigured)


# Values Django started with before, which failed only at ``manage.py anarchon run``.
REFUSED_AT_START: dict[str, dict[str, Any]] = {
    "settings.ANARCHON['backend']: backend URL 'bogus://x' has an unknown scheme 'bogus'": {
        "backend": "bogus://x"
    },
    "settings.ANARCHON['backend'] = '' must be a backend URL": {"backend": ""},
    "settings.ANARCHON['backend']: Redis URL 'redis://127.0.0.1:1/0?prefx=1' has option(s)": {
        "backend": "redis://127.0.0.1:1/0?prefx=1"
    },
    "settings.ANARCHON['database'] = 'pg': schema='BAD' must be 1-63 characters": {
        "database": "pg",
        "backend_options": {"schema": "BAD"},
    },
    "settings.ANARCHON['database'] = 'pg': max_connections=0 for the backend URL": {
        "database": "pg",
        "backend_options": {"max_connections": 0},
    },
    "settings.ANARCHON: grace_ms='abc' for Scheduler must be an integer from 0 to 86400000": {
        "backend": "memory://",
        "grace_ms": "abc",
    },
    "settings.ANARCHON: time zone 'Mars/Base' is not a known IANA zone name": {
        "timezone": "Mars/Base"
    },
    "settings.ANARCHON: time zone '' is not an IANA zone name": {"timezone": ""},
    "settings.ANARCHON: max_workers=0 for Scheduler is out of range": {"max_workers": 0},
    "settings.ANARCHON: instance_id=5 must be a non-empty string": {"instance_id": 5},
}


@pytest.mark.parametrize("message", REFUSED_AT_START)
def test_every_setting_is_checked_when_django_starts(message: str) -> None:
    """Before: these passed ``ready()`` (so ``manage.py check`` and every web worker) and
    failed only ``manage.py anarchon run``. Now ``ready()``'s check and ``build_scheduler()``
    (``anarchon run``) refuse them with one message, naming where the value came from."""
    from anarchon.integrations.django import build_scheduler, check_settings

    with override_settings(ANARCHON=REFUSED_AT_START[message]):
        with pytest.raises(ImproperlyConfigured) as at_start:
            check_settings()
        with pytest.raises(ImproperlyConfigured) as at_run:
            build_scheduler()
    assert str(at_start.value) == str(at_run.value)
    assert str(at_start.value).startswith(message), str(at_start.value)
    assert isinstance(at_start.value, ConfigurationError)  # 'anarchon run' exits with 2
    assert SECRET not in str(at_start.value)


def test_the_check_connects_to_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backends nobody listens for pass the check at once: it makes them, never starts them."""
    from anarchon.integrations.django import check_settings

    unreachable = ["postgresql://127.0.0.1:1/test", "redis://127.0.0.1:1/0", "nats://127.0.0.1:1"]
    began = time.monotonic()
    for url in unreachable:
        with override_settings(ANARCHON={"backend": url, "grace_ms": 0, "instance_id": "w"}):
            check_settings()
    with override_settings(ANARCHON={"database": "pg"}):  # db.internal: not resolvable here
        check_settings()
    with override_settings(ANARCHON={}):  # every key at its default: SQLite in ./anarchon.db
        monkeypatch.chdir(tempfile.mkdtemp())
        check_settings()
        assert not os.listdir(".")  # no file made
        monkeypatch.setenv("ANARCHON_BACKEND", "bogus://x")
        with pytest.raises(ImproperlyConfigured, match=r"^\$ANARCHON_BACKEND: backend URL 'bog"):
            check_settings()
    assert time.monotonic() - began < 5


def test_jobs_take_time_zone_by_default_and_run_with_stale_connections_closed(
    registry: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import django.db

    from anarchon.integrations.django import build_scheduler, job, registered_jobs

    calls: list[str] = []
    closing = django.db.close_old_connections

    def spy() -> None:
        calls.append(f"close on {threading.current_thread().name}")
        closing()

    monkeypatch.setattr(django.db, "close_old_connections", spy)
    seen: dict[str, Any] = {}

    @job("plain", "0 6 * * *")
    def plain(ctx: RunContext) -> None:
        from django.db import connection

        calls.append(f"plain on {threading.current_thread().name}")
        with connection.cursor() as cursor:  # opens this thread's connection
            cursor.execute("SELECT 1")
        seen["connection"] = connection

    @job("coro", "0 7 * * *", timezone="UTC")
    async def coro(ctx: RunContext) -> None:
        calls.append("coro")

    assert [spec.name for spec in registered_jobs()] == ["plain", "coro"]
    zones: dict[str, object] = {}
    adding = Scheduler.add

    def add(self: Scheduler, name: str, schedule: str, handler: Any, **options: Any) -> None:
        zones[name] = options.get("timezone")
        adding(self, name, schedule, handler, **options)

    monkeypatch.setattr(Scheduler, "add", add)
    with override_settings(ANARCHON={"backend": "memory://"}):
        scheduler = build_scheduler()
    assert zones == {"plain": "Europe/Athens", "coro": "UTC"}  # TIME_ZONE unless named
    assert scheduler.jobs == {"plain": "0 6 * * *", "coro": "0 7 * * *"}

    async def run_both() -> list[RunStatus]:
        async with scheduler:
            return [(await scheduler.run_now(name)).status for name in ("plain", "coro")]

    import asyncio

    assert asyncio.run(run_both()) == [RunStatus.SUCCEEDED, RunStatus.SUCCEEDED]
    worker = calls[1].removeprefix("plain on ")
    assert calls[:3] == [f"close on {worker}", f"plain on {worker}", f"close on {worker}"]
    assert calls[3] != "coro" and calls[4] == "coro" and calls[5].startswith("close on ")
    # CONN_MAX_AGE is 0: the handler thread's connection was closed after the run.
    assert seen["connection"].connection is None


def test_async_handlers_of_every_shape_are_wrapped_as_async(registry: list[Any]) -> None:
    import functools

    from anarchon.integrations.django import build_scheduler, job

    ran: list[str] = []

    async def with_extra(ctx: RunContext, extra: str) -> None:
        ran.append(extra)

    class Handler:
        async def __call__(self, ctx: RunContext) -> None:
            ran.append("__call__")

    job("partial", "0 6 * * *")(functools.partial(with_extra, extra="partial"))
    job("object", "0 6 * * *")(Handler())
    with override_settings(ANARCHON={"backend": "memory://"}):
        scheduler = build_scheduler()

    async def run_both() -> list[Any]:
        async with scheduler:
            return [await scheduler.run_now(name) for name in ("partial", "object")]

    import asyncio

    runs = asyncio.run(run_both())
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 2, [r.error for r in runs]
    assert ran == ["partial", "__call__"]


def _python(code: str) -> str:
    """Run ``code`` in a new Python process (nothing imported yet); its output, once it exited
    with 0."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_django_the_import_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['django'] = None\n"
        "from anarchon import MissingDependency\n"
        "try:\n"
        "    import anarchon.integrations.django\n"
        "except MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    assert "pip install 'anarchon[django]'" in _python(code)


def test_a_backend_client_not_installed_passes_the_start_check_but_not_anarchon_run() -> None:
    """A web image may leave the backend's client out (the scheduler runs in ``manage.py
    anarchon run``): Django starts, the other keys are still checked, and only building the
    scheduler says what to install."""
    code = (
        "import sys; sys.modules['nats'] = None\n"
        "import django; from django.conf import settings\n"
        "settings.configure(ANARCHON={'backend': 'nats://127.0.0.1:1'})\n"
        "django.setup()\n"
        "from django.test import override_settings\n"
        "from anarchon.integrations.django import build_scheduler, check_settings\n"
        "check_settings()\n"
        "print('checked')\n"
        "with override_settings(ANARCHON={'backend': 'nats://127.0.0.1:1', 'grace_ms': -1}):\n"
        "    try:\n"
        "        check_settings()\n"
        "    except Exception as exc:\n"
        "        print('refused:', exc)\n"
        "try:\n"
        "    build_scheduler()\n"
        "except Exception as exc:\n"
        "    print('run:', exc)\n"
    )
    out = _python(code)
    checked, refused, run = out.splitlines()
    assert checked == "checked", out
    assert refused.startswith("refused: settings.ANARCHON: grace_ms=-1"), out
    assert run.startswith("run: settings.ANARCHON['backend']: "), out
    assert "pip install 'anarchon[nats]'" in run, out
