"""``anarchon dashboard``: serve the dashboard alone, on loopback unless told otherwise.

    anarchon dashboard --backend URL [--host 127.0.0.1] [--port 8080] [--token-file F]

Exit codes follow the other commands (README, "Command line"): 0 once stopped by SIGTERM (as
``anarchon run``; one that comes while it still imports or checks the backend too: it then
never serves), 130 by Ctrl-C (SIGINT), 2 for a bad option, a token file that cannot be read,
an address it cannot listen on (a port taken) or a missing ``web`` extra, 3 when the backend
holds no anarchon data, as the other commands find
it (no SQLite file or PostgreSQL tables of anarchon's, no NATS stream; on Redis, where only a
record can tell, no scheduler ever recorded itself under the prefix): a mistyped URL, schema,
prefix or stream is told at once rather than served as failing pages. A backend that does not
answer at the start is only warned about: the dashboard serves, and its pages answer 503 until
it does.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from .._early import EarlySignals
from .._redact import redact_url
from ..errors import MissingDependency

if TYPE_CHECKING:
    import uvicorn

__all__ = ["add_parser", "run_dashboard"]

EXIT_OK: Final = 0
EXIT_USAGE: Final = 2
#: How long (s) the check for anarchon's data may wait for the backend before serving anyway.
CHECK_TIMEOUT_S: Final = 15.0


def _port(text: str) -> int:
    """``--port``'s value as a number from 1 to 65535 (argparse's error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port number from 1 to 65535")
    return value


def add_parser(sub: Any, env_backend: str) -> None:
    """Add the ``dashboard`` command to the ``anarchon`` parser's subcommands."""
    text = "serve the web dashboard: jobs, slots, instances, pause and trigger"
    command = sub.add_parser("dashboard", help=text, description=text)
    command.add_argument(
        "--backend",
        help=f"backend URL; default ${env_backend}, else SQLite at $ANARCHON_DB or ./anarchon.db",
    )
    command.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback)"
    )
    command.add_argument("--port", type=_port, default=8080, help="port (default 8080)")
    command.add_argument(
        "--token-file",
        type=Path,
        help="file holding the operator token (8+ characters); without it the dashboard is "
        "read-only",
    )
    command.add_argument("--title", default="anarchon", help="shown in the header")


def _fail(code: int, message: str) -> int:
    """Print ``message`` as the command's error on stderr; return ``code``."""
    print(f"anarchon dashboard: {message}", file=sys.stderr)
    return code


def _read_token(path: Path) -> str:
    """The operator token the file at ``path`` holds, stripped; ValueError if the file cannot
    be read or the token has fewer than 8 characters."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {str(path)!r}: {exc}") from None
    if len(token) < 8:
        raise ValueError(
            f"the token file {str(path)!r} holds {len(token)} characters; an operator token "
            "has at least 8"
        )
    return token


def _cannot_listen(host: str, port: int) -> str | None:
    """Why the dashboard could not listen on ``host:port`` (an address not of this host, a port
    taken), tried as uvicorn will bind it; None if it can. Told before the backend is opened."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc}"
    return None


def _loopback(host: str) -> bool:
    """True if ``host`` is ``localhost`` or a loopback address (reachable from this host
    only)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _require_data(url: str | None, early: EarlySignals) -> None:
    """Exit (:class:`anarchon._cli.common.Exit`) as the other commands do where ``url`` holds
    no anarchon data; creates nothing (``start_reader``). SIGINT or SIGTERM (``early``)
    cancels the check at once (up to :data:`CHECK_TIMEOUT_S` on a backend that does not
    answer)."""
    from .._cli.common import no_data, opened, storage_checked

    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    assert task is not None

    def wake() -> None:  # in the signal handler: the loop runs on this thread, between steps
        """Cancel the check (``early`` calls it on SIGINT or SIGTERM)."""
        loop.call_soon_threadsafe(task.cancel)

    early.on_signal(wake)
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S), opened(url, registry=False) as backend:
            store = backend.registry()
            if not storage_checked(backend) and store is not None and not await store.exists():
                raise no_data(backend, ": no scheduler recorded itself")
    finally:
        early.on_signal(_nothing)  # the loop ends here: a later signal must not call into it


def _nothing() -> None:
    """Do nothing: ``early``'s callback once the check is over."""


def _check_data(url: str | None, early: EarlySignals) -> int | None:
    """The exit code when ``url`` holds no anarchon data; None to serve (a backend that does
    not answer now is warned about: an outage passes, the pages say 503 meanwhile), or when
    a signal cancelled the check (the caller sees it in ``early``)."""
    from .._cli.common import EXIT_BACKEND, Exit
    from ..errors import BackendError

    try:
        asyncio.run(_require_data(url, early))
    except asyncio.CancelledError:
        return None  # SIGINT or SIGTERM: told by the caller
    except Exit as exc:
        if exc.code != EXIT_BACKEND:
            return _fail(exc.code, str(exc))
        problem = str(exc).removeprefix("anarchon: ")
    except BackendError as exc:
        problem = f"the backend cannot be reached: {exc}"
    except TimeoutError:
        problem = f"the backend did not answer within {CHECK_TIMEOUT_S:g} s"
    else:
        return None
    problem = redact_url(problem).rstrip(".")
    print(
        f"anarchon dashboard: warning: {problem}; serving anyway (pages answer 503 until it "
        "answers)",
        file=sys.stderr,
    )
    return None


def run_dashboard(args: argparse.Namespace, early: EarlySignals | None = None) -> int:
    """Serve the dashboard until SIGINT/SIGTERM; return the exit code (0 after SIGTERM).

    ``early``: SIGINT and SIGTERM caught since the process began (:mod:`anarchon._early`). One
    that comes before the dashboard serves (its imports take seconds on a loaded host) ends the
    command there as it would have ended the serving: exit 0 after SIGTERM, 130 after SIGINT
    (``KeyboardInterrupt``). Both signals have their default actions back on return."""
    early = early or EarlySignals()
    try:
        return _run_dashboard(args, early)
    finally:
        early.restore()


def _stopped(early: EarlySignals) -> int | None:
    """EXIT_OK when SIGTERM came before the dashboard served; KeyboardInterrupt for SIGINT;
    None when neither came."""
    if not early.caught:
        return None
    name = early.caught[0]
    print(f"anarchon dashboard: {name} before it served: not serving", file=sys.stderr)
    if name == "SIGINT":
        raise KeyboardInterrupt
    return EXIT_OK


def _run_dashboard(args: argparse.Namespace, early: EarlySignals) -> int:
    """:func:`run_dashboard`'s work: check the ``web`` extra (MissingDependency), the token
    file and the address (exit 2), then the backend's data (:func:`_check_data`), and serve;
    a signal that comes before it serves ends it (:func:`_stopped`). Returns the exit code."""
    try:
        import uvicorn
    except ImportError:
        raise MissingDependency(
            "anarchon dashboard needs uvicorn, Starlette and Jinja2: pip install 'anarchon[web]'"
        ) from None
    from .._cli.common import make_backend
    from . import dashboard

    stopped = _stopped(early)
    if stopped is not None:
        return stopped
    token = None
    if args.token_file is not None:
        try:
            token = _read_token(args.token_file)
        except ValueError as exc:
            return _fail(EXIT_USAGE, str(exc))
    cannot = _cannot_listen(args.host, args.port)
    if cannot is not None:  # before the backend is opened: a bad option, told at once
        return _fail(EXIT_USAGE, f"{cannot}: pick another --port or --host")
    code = _check_data(args.backend, early)
    if code is not None:
        return code
    stopped = _stopped(early)
    if stopped is not None:
        return stopped
    backend = make_backend(args.backend)
    where = redact_url(repr(backend))
    if not _loopback(args.host):
        print(
            f"anarchon dashboard: listening on {args.host}, beyond this host"
            + ("" if token else "; read-only (no --token-file)"),
            file=sys.stderr,
        )
    app = dashboard(backend, token=token, title=args.title)
    mode = "operators sign in with the token" if token else "read-only"
    print(
        f"anarchon dashboard on http://{args.host}:{args.port}/ for {where} ({mode})",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    try:
        if not _serve_until_stopped(server, early):
            return _stopped(early) or EXIT_OK
    except SystemExit as exc:
        if server.started:
            raise
        # uvicorn exits with its own code 3 when it cannot listen (the port is taken, the
        # address is not this host's): 3 here means "no anarchon data", so say what it is.
        return _fail(
            EXIT_USAGE,
            f"cannot listen on {args.host}:{args.port} (exit {exc.code} from uvicorn; its error "
            "above says why): pick another --port or --host",
        )
    return EXIT_OK


def _serve_until_stopped(server: uvicorn.Server, early: EarlySignals) -> bool:
    """Run the uvicorn ``server`` until SIGINT or SIGTERM, and return True after a SIGTERM;
    False, without serving, when a signal caught by ``early`` came first.

    uvicorn stops gracefully on either, then raises the signal it caught again once its own
    handlers are gone. SIGINT then ends the command as a Ctrl-C (exit 130, main()'s
    KeyboardInterrupt); SIGTERM, the stop that systemd and Kubernetes send, would kill the
    process (exit 143: a failed unit, an errored container). So the SIGTERM handler in place
    around ``server.run()`` is this one: it asks the server to stop (a SIGTERM before uvicorn
    installs its own) and, raised again, lets the command return 0 as ``anarchon run`` does.
    """

    def stop(signum: int, frame: FrameType | None) -> None:
        """SIGTERM's handler: ask the server to stop."""
        server.should_exit = True

    # These handlers take over from early's: SIGINT raises KeyboardInterrupt again, as uvicorn
    # expects of the handler it saves and calls once it has stopped.
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, stop),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
    }
    try:
        if early.caught:  # came before these handlers were in place
            return False
        server.run()
        return True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
