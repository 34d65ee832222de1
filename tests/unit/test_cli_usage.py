"""Every subcommand's bad arguments are a bad command line: exit 2, one line naming the value and
the rule, told before the backend is opened. Checked against a backend URL whose listener
accepts and never answers: a command that opened it would connect there (and then wait and
exit 4, "the backend cannot be reached"), which the listener sees."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import any_free
from tests.unit.test_cli import APP, ROOT, one_line_error

HAS_WEB = importlib.util.find_spec("uvicorn") is not None

CASES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("health", "--instance", ""), ("--instance=''", "non-empty string of at most 256")),
    (("health", "--instance", "a\nb"), ("--instance='a\\nb'", "must be printable")),
    (("health", "--instance", "i" * 300), ("300 characters", "at most 256")),
    (("health", "--json", "--instance", ""), ("--instance=''",)),
    (("health", "--timeout", "0"), ("'0'", "above 0")),
    (("jobs", "--backend", ""), ("backend URL ''", "sqlite:///anarchon.db")),
    (("instances", "--backend", " "), ("backend URL ' '",)),
    (("history", "a b"), ("job name 'a b'",)),
    (("history", "tick", "-n", "0"), ("'0'", "from 1 to")),
    (("explain", "tick", "notatime"), ("'notatime'",)),
    (("explain", "a/b", "2026-01-01T00:00:00"), ("job name 'a/b'",)),
    (("pause",), ("give a JOB, or --all",)),
    (("pause", "tick", "--all"), ("not both",)),
    (("pause", "*"), ("use --all",)),
    (("pause", "tick", "--until", "soon"), ("'soon'",)),
    (("pause", "tick", "--until", "-5m"), ("in the past",)),
    (
        ("pause", "tick", "--until", "2001-01-01T00:00:00"),
        ("'2001-01-01T00:00:00'", "not in the future"),
    ),
    (("pause", "tick", "--until", "2100-01-01"), ("'2100-01-01'", "more than 10 years")),
    (("pause", "tick", "--until", "600w"), ("'600w'", "more than 10 years")),
    (("pause", "tick", "--by", ""), ("--by",)),
    (("resume",), ("give a JOB, or --all",)),
    (("resume", "a b"), ("job name 'a b'",)),
    (("trigger", "a b"), ("job name 'a b'",)),
    (("trigger", "tick", "--by", "x\ty"), ("--by",)),
    (("run", "cronapp"), ("'cronapp' must be 'module:attribute'",)),
    (("run", "nosuchmodule:scheduler"), ("cannot import 'nosuchmodule'",)),
    (("run", "cronapp:scheduler", "--backend", ""), ("--backend ''", "is empty")),
    (("run", "cronapp:scheduler", "--metrics-port", "70000"), ("'70000'", "from 0 to 65535")),
    (
        (
            "run",
            "cronapp:scheduler",
            "--metrics-port",
            "0",
            "--metrics-host",
            "no.such.host.invalid",
        ),
        ("cannot listen on no.such.host.invalid:0",),
    ),
]
if HAS_WEB:
    CASES += [
        (("dashboard", "--port", "0"), ("'0'", "port number from 1 to 65535")),
        (("dashboard", "--token-file", "/no/such/file"), ("/no/such/file",)),
        (
            ("dashboard", "--host", "no.such.host.invalid"),
            ("cannot listen on no.such.host.invalid",),
        ),
        (("dashboard", "--backend", "", "--port", "{free}"), ("backend URL ''",)),
    ]


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    """A listener that accepts (the kernel completes the handshake) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        listener.setblocking(False)
        yield listener


def _connected(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@pytest.mark.parametrize("scheme", ["redis", "postgresql"])
@pytest.mark.parametrize(("args", "texts"), CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_arguments_exit_2_before_the_backend_is_opened(
    tmp_path: Path,
    silent: socket.socket,
    scheme: str,
    args: tuple[str, ...],
    texts: tuple[str, ...],
) -> None:
    port = silent.getsockname()[1]
    url = f"{scheme}://127.0.0.1:{port}" + ("/x?timeout_ms=60000" if scheme == "postgresql" else "")
    (tmp_path / "cronapp.py").write_text(APP)  # `run`: its Scheduler() reads $ANARCHON_BACKEND
    env = {k: v for k, v in os.environ.items() if k != "ANARCHON_DB"}
    env.update(ANARCHON_BACKEND=url, PYTHONPATH=env.get("PYTHONPATH", str(ROOT / "src")))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    free = str(any_free())
    out = subprocess.run(
        [sys.executable, "-m", "anarchon", *(free if a == "{free}" else a for a in args)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    one_line_error(out, 2, *texts)
    assert not _connected(silent), f"{args}: the backend was opened before the arguments were"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cronapp.py"], "a file was made"
