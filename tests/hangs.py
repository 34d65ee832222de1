"""Stacks of a test that hangs: pytest-timeout ends the worker (os._exit) and its output is lost.

Each test arms :func:`faulthandler.dump_traceback_later` a few seconds before pytest-timeout's
bound, into a file of the run's own folder named after the worker; the file starts with the
test's id. Two seconds before that, a timer thread writes the stack of every unfinished asyncio
task there too: a hung ``await`` (a fixture's teardown, say) shows only as an idle event loop in
the threads' stacks. At the end of the run the controller prints every file that holds a dump, so a
worker that "crashed" (``node down: Not properly terminated``) names where it was stuck.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import tempfile
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "ANARCHON_TEST_HANGS"
#: Seconds before pytest-timeout's bound at which the stacks are written.
EARLY_S = 10.0
#: Seconds before the threads' stacks at which the asyncio tasks' stacks are written.
TASKS_EARLY_S = 2.0


def _awaiting(coro: Any) -> list[str]:
    """Where a coroutine waits, outermost first: each frame down the chain of awaits (through
    async generators too, which Task.print_stack does not follow)."""
    lines: list[str] = []
    while coro is not None and len(lines) < 60:
        frame = next(
            (getattr(coro, a) for a in ("cr_frame", "ag_frame", "gi_frame") if hasattr(coro, a)),
            None,
        )
        if frame is not None:
            code = frame.f_code
            lines.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        awaits = ("cr_await", "ag_await", "gi_yieldfrom")
        coro = next((getattr(coro, a) for a in awaits if hasattr(coro, a)), None)
    if coro is not None:
        lines.append(repr(coro))
    return lines


def _write_tasks(sink: Any) -> None:
    """Write the stack of every unfinished asyncio task (found through the garbage collector:
    the loop runs in another thread, so asyncio.all_tasks cannot be asked from here)."""
    try:
        tasks = [t for t in gc.get_objects() if isinstance(t, asyncio.Task) and not t.done()]
        sink.write(f"\n--- {len(tasks)} unfinished asyncio task(s)\n")
        for task in tasks:
            sink.write(f"\n{task!r}\n")
            for line in _awaiting(task.get_coro()):
                sink.write(f"  {line}\n")
        # A task awaiting an async generator (a fixture's teardown) shows only that generator's
        # asend object: the generators themselves, suspended in an await, say where.
        for agen in gc.get_objects():
            if isinstance(agen, types.AsyncGeneratorType) and agen.ag_await is not None:
                sink.write(f"\nasync generator {agen.__qualname__} awaiting:\n")
                for line in _awaiting(agen):
                    sink.write(f"  {line}\n")
        sink.write("--- end of asyncio tasks\n\n")
        sink.flush()
    except Exception as exc:  # a diagnosis must never fail the run
        sink.write(f"(asyncio tasks not written: {exc!r})\n")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None and ENV not in os.environ:
        # The controller (or a run without xdist): one folder, inherited by the workers.
        os.environ[ENV] = tempfile.mkdtemp(prefix="anarchon-test-hangs-")


def _bound(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    given = item.config.getoption("timeout", None)  # --timeout N on the command line
    if given is not None:
        return float(given)
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    folder, bound = os.environ.get(ENV), _bound(item)
    if folder is None or bound <= EARLY_S:
        yield
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(folder) / f"{worker}.txt", "w") as sink:
        sink.write(f"{item.nodeid}\n")
        sink.flush()
        faulthandler.dump_traceback_later(bound - EARLY_S, file=sink)
        tasks = threading.Timer(bound - EARLY_S - TASKS_EARLY_S, _write_tasks, (sink,))
        tasks.daemon = True
        tasks.start()
        try:
            yield
        finally:
            tasks.cancel()
            tasks.join()
            faulthandler.cancel_dump_traceback_later()
            sink.truncate(0)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    folder = os.environ.get(ENV)
    if folder is None or os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return
    for dump in sorted(Path(folder).glob("*.txt")):
        text = dump.read_text(errors="replace")
        if "\n" in text.strip():
            terminalreporter.write_sep("=", f"stacks of a test past its time ({dump.stem})")
            terminalreporter.write(text)
