"""The public surface is deliberate: sorted, documented, and free of optional drivers."""

from __future__ import annotations

import inspect
import subprocess
import sys

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


def test_importing_anarchon_imports_no_driver() -> None:
    code = (
        "import sys, anarchon, anarchon.cli; "
        "print(sorted(m for m in ('redis', 'nats', 'psycopg', 'psycopg_pool') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
