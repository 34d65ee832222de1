"""SIGINT and SIGTERM held from the first moment the ``anarchon`` command runs.

Importing anarchon takes seconds on a loaded host (its backends, the scheduler, the CLI), and
the command's own handlers come after that: a deploy's SIGTERM meanwhile killed ``anarchon
run`` (exit 143) before it could exit 0 as for any stop by signal. Both ways in run the
package's ``__init__`` before any command code (``python -m anarchon`` imports the package
before its ``__main__``; the console script imports ``anarchon.cli``, so the package first), so
the package imports this module first, and it catches both signals there, in the ``anarchon``
command's process only (:func:`is_command`; never in an application that imports anarchon).
:func:`anarchon.cli.main` then takes them over (``run``, ``dashboard``) or gives them back
(other commands).

Only the standard library's ``signal`` and ``sys``: nothing slow runs before the handlers.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["EARLY", "EarlySignals", "is_command"]

_CAUGHT = (signal.SIGINT, signal.SIGTERM)


class EarlySignals:
    """SIGINT and SIGTERM caught before an event loop's handlers exist: each is recorded
    (:attr:`caught`) and wakes whoever asked (:meth:`on_signal`). A second one gets its default
    action at once, so a start-up stuck for ever can still be ended."""

    def __init__(self) -> None:
        self.caught: list[str] = []
        """The names of the signals caught, in order (one at most: a second is not caught)."""
        self._wake: Callable[[], None] | None = None

    def install(self) -> None:
        """Catch both signals from now on (main thread only; an event loop later takes them)."""
        for sig in _CAUGHT:
            try:
                signal.signal(sig, self._caught)
            except ValueError:  # not the main thread
                return

    def on_signal(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (from the signal handler) on the signal; at once if one came already."""
        self._wake = wake
        if self.caught:
            wake()

    def release(self) -> None:
        """Give both signals their default actions back, then take the one caught (if any) as
        it would have been taken: SIGTERM ends the process, SIGINT raises KeyboardInterrupt."""
        _defaults()
        if self.caught:
            signal.raise_signal(signal.Signals[self.caught[0]])

    def restore(self) -> None:
        """Give both signals their default actions back; a signal caught stays in
        :attr:`caught`, not taken (its command already acted on it)."""
        self._wake = None
        _defaults()

    def _caught(self, signum: int, frame: FrameType | None) -> None:
        if self.caught:
            _defaults()
            signal.raise_signal(signum)
            return
        self.caught.append(signal.Signals(signum).name)
        if self._wake is not None:
            self._wake()


def _defaults() -> None:
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread
        pass


def is_command() -> bool:
    """Whether this process is the ``anarchon`` command: ``python -m anarchon`` (runpy imports
    the package while ``sys.argv[0]`` is ``-m``, and the interpreter's own arguments name it), or
    a main script whose code imports ``anarchon.cli`` (the console script's ``from anarchon.cli
    import main``) and is importing it now. Never an application that imports anarchon."""
    if sys.argv[:1] == ["-m"]:
        return _module_run(sys.orig_argv[1:]) == "anarchon"
    main = sys.modules.get("__main__")
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_globals is getattr(main, "__dict__", None) and frame.f_back is None:
            return "anarchon.cli" in frame.f_code.co_names
        frame = frame.f_back
    return False


def _module_run(words: list[str]) -> str | None:
    """The module the interpreter's options ``words`` run with ``-m`` (``-m anarchon``,
    ``-manarchon``, ``-Im anarchon``), None if they run something else."""
    n = 0
    while n < len(words):
        word = words[n]
        if not word.startswith("-") or word.startswith("--") or word == "-":
            return None  # a script, or the end of the options
        for at, flag in enumerate(word[1:], 2):
            if flag == "c":
                return None
            if flag == "m":
                return word[at:] or (words[n + 1] if n + 1 < len(words) else None)
            if flag in "WX":  # its value: the rest of the word, or the next word
                if at == len(word):
                    n += 1
                break
        n += 1
    return None


EARLY: EarlySignals | None = None
"""The signals held since the package's import, in the ``anarchon`` command's process only."""

if is_command():
    EARLY = EarlySignals()
    EARLY.install()
