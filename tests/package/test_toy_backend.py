"""The toy backend of docs/writing-a-backend.md (docs/examples/toy_backend.py), installed as an
outside package would be (a module on sys.path and a dist-info folder with its entry point),
found by URL scheme through backend_from_url and held to anarchon.testing.contract."""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from anarchon import Backend, InvalidOption, MemoryBackend, backend_from_url
from anarchon.testing.contract import LeaseBackendContract

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "toy_backend.py"


def install_toy(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write the toy backend as the package ``toy_anarchon`` with entry points ``toy`` and
    ``memory`` (the built-in scheme must win) in the group ``anarchon.backends``."""
    package = root / "toy_anarchon"
    package.mkdir()
    shutil.copy(EXAMPLE, package / "__init__.py")
    info = root / "toy_anarchon-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-anarchon\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[anarchon.backends]\ntoy = toy_anarchon:ToyBackend\nmemory = toy_anarchon:ToyBackend\n"
    )
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "toy_anarchon", raising=False)
    importlib.invalidate_caches()


class TestToyBackend(LeaseBackendContract):
    """The whole contract suite, on the toy backend reached by its URL."""

    @pytest.fixture
    def backend_factory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Callable[[], Backend]:
        install_toy(tmp_path, monkeypatch)
        return lambda: backend_from_url("toy://?history_size=1000")


def test_entry_points_add_schemes_and_built_ins_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_toy(tmp_path, monkeypatch)
    backend = backend_from_url("toy://?history_size=5")
    assert type(backend).__name__ == "ToyBackend" and backend.rows.history_size == 5  # type: ignore[attr-defined]
    assert isinstance(backend_from_url("memory://"), MemoryBackend)
    with pytest.raises(InvalidOption, match=r"unknown scheme 'ftp'.*toy://.*'anarchon\.backends'"):
        backend_from_url("ftp://host/")
    with pytest.raises(InvalidOption, match=r"unknown option 'colour'.*history_size"):
        backend_from_url("toy://?colour=red")
