"""The public surface is deliberate: sorted, documented, and free of optional drivers."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import anarchon
import anarchon.backend
import anarchon.errors


def test_all_is_sorted_and_complete() -> None:
    public = {name for name in dir(anarchon) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(anarchon, name))}
    modules.add("annotations")  # from __future__ import annotations
    assert anarchon.__all__ == sorted(anarchon.__all__)
    assert set(anarchon.__all__) - {"__version__"} == public - modules


def test_every_public_name_has_a_docstring() -> None:
    for module in (anarchon, anarchon.backend, anarchon.errors):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert obj.__doc__, f"{module.__name__}.{name} has no docstring"
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        assert member.__doc__, f"{name}.{attr} has no docstring"


def test_errors_subclass_the_builtins_they_are() -> None:
    assert issubclass(anarchon.InvalidSchedule, ValueError)
    assert issubclass(anarchon.UnsupportedFeature, ValueError)
    assert issubclass(anarchon.JobNotFound, LookupError)
    assert issubclass(anarchon.MissingDependency, ImportError)
    for name in anarchon.errors.__all__:
        assert issubclass(getattr(anarchon.errors, name), anarchon.AnarchonError)


def _python(code: str) -> list[str]:
    """What a fresh interpreter running ``code`` printed, line by line."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_importing_anarchon_imports_no_driver() -> None:
    code = (
        "import sys, anarchon, anarchon.cli; "
        "print(sorted(m for m in ('redis', 'nats', 'psycopg', 'psycopg_pool') if m in sys.modules))"
    )
    assert _python(code) == ["[]"]


def public_callables() -> list[tuple[str, object]]:
    """Every public function, class, and method or property of a class (its own and inherited
    from anarchon's classes) that ``anarchon`` exports."""
    found: list[tuple[str, object]] = []
    for name in anarchon.__all__:
        obj = getattr(anarchon, name)
        if inspect.isfunction(obj):
            found.append((name, obj))
        if not inspect.isclass(obj):
            continue
        found.append((name, obj))
        for base in obj.__mro__:
            if not base.__module__.startswith("anarchon"):
                continue
            for attr, member in vars(base).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                if isinstance(member, classmethod | staticmethod):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    found.append((f"{name}.{attr}", member))
    return found


def test_public_annotations_resolve_at_runtime() -> None:
    # typing.get_type_hints(Scheduler.add) raised NameError: 'RunContext' (imported for type
    # checkers only); frameworks that read signatures at runtime (FastAPI, pydantic) call it.
    import typing

    unresolved = []
    for name, obj in public_callables():
        try:
            typing.get_type_hints(obj)
        except Exception as exc:  # the test reports every name, not the first
            unresolved.append(f"{name}: {type(exc).__name__}: {exc}")
    assert len(public_callables()) > 150
    assert not unresolved, "\n".join(unresolved)
    async_handler = typing.get_args(typing.get_type_hints(anarchon.Scheduler.add)["handler"])[0]
    assert typing.get_args(async_handler)[0] == [anarchon.RunContext]


def test_scheduler_add_documents_every_option() -> None:
    # Its docstring read "the options (...), with its defaults" and sent the reader to the
    # README's table, which the API reference (where the docstring is shown) does not have.
    from anarchon._job import JobKwargs

    doc = inspect.getdoc(anarchon.Scheduler.add)
    assert doc is not None and "README" not in doc and "with its defaults" not in doc
    for option in JobKwargs.__optional_keys__:
        assert f"- ``{option}`` (" in doc, option
    for param in ("name", "schedule", "handler", "options"):
        assert f":param {param}:" in doc, param


def test_the_types_the_api_hands_out_are_exported() -> None:
    # Observation.state and Health.state were typed by a private alias, Scheduler.state by
    # another, Metrics' histograms were importable from anarchon.prometheus only, and the
    # backends' control and registry from private modules (tests/unit/test_public_types.py).
    import typing

    import anarchon.backends.nats
    import anarchon.backends.postgres
    import anarchon.backends.redis
    import anarchon.backends.sqlite
    import anarchon.health
    import anarchon.integrations.django
    import anarchon.prometheus
    import anarchon.registry

    hints = typing.get_type_hints
    assert hints(anarchon.Observation)["state"] is anarchon.ObservedState
    assert (
        hints(anarchon.Health)["state"] is anarchon.health.ObservedState is anarchon.ObservedState
    )
    assert hints(vars(anarchon.Scheduler)["state"].fget)["return"] is anarchon.LifeCycle
    assert (
        hints(anarchon.Metrics)["fire_lag"] is anarchon.Histogram is anarchon.prometheus.Histogram
    )
    assert hints(anarchon.Scheduler.add)["handler"] is anarchon.Handler
    assert hints(anarchon.JobKwargs)["timezone"] is anarchon.Timezone
    options = hints(anarchon.registry.JobDefinition)["options"]
    assert typing.get_args(options)[1] is anarchon.registry.OptionValue
    for module in (
        anarchon.backends.nats,
        anarchon.backends.postgres,
        anarchon.backends.redis,
        anarchon.backends.sqlite,
    ):
        [backend] = [getattr(module, n) for n in module.__all__ if n.endswith("Backend")]
        for store in ("control", "registry"):
            member = getattr(backend, store)
            returned = hints(member.fget if isinstance(member, property) else member)["return"]
            assert (
                returned.__name__ in module.__all__
                and getattr(module, returned.__name__) is returned
            )
    assert hints(anarchon.NatsBackend.__init__)["access_options"].__args__[0] is (
        anarchon.backends.nats.AccessKwargs
    )
    assert (
        hints(anarchon.integrations.django.registered_jobs)["return"]
        == list[anarchon.integrations.django.JobSpec]
    )


NETWORK = ("anarchon.backends.nats", "anarchon.backends.postgres", "anarchon.backends.redis")
LOADED = f"print(sorted(m for m in sys.modules if m.startswith({NETWORK!r})))"


def test_the_network_backends_are_imported_when_first_named(tmp_path: Path) -> None:
    # Importing the package loads no network backend; naming one imports it: the same class
    # as its module's, in dir() before and after.
    assert _python(
        "import sys, anarchon\n"
        f"{LOADED}\n"
        "print([n for n in dir(anarchon) if n.endswith('Backend')])\n"
        "from anarchon import NatsBackend\n"
        "import anarchon.backends.nats as nats\n"
        "print(NatsBackend is nats.NatsBackend is anarchon.NatsBackend)\n"
        "print(anarchon.RedisBackend.__module__, anarchon.PostgresBackend.__name__)"
    ) == [
        "[]",
        "['Backend', 'LeaseBackend', 'MemoryBackend', 'NatsBackend', 'PostgresBackend', "
        "'RedisBackend', 'SQLiteBackend']",
        "True",
        "anarchon.backends.redis._backend PostgresBackend",
    ]
    # Nor does a command on SQLite (it checks for PostgreSQL tables only on PostgreSQL).
    db = tmp_path / "none.db"
    assert _python(
        "import runpy, sys\n"
        f"sys.argv = ['anarchon', 'jobs', '--backend', {str(db)!r}]\n"
        "try:\n    runpy.run_module('anarchon', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        f"{LOADED}"
    )[-1:] == ["[]"]
