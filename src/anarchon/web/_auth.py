"""Who may act: an operator token (or the host app's callable), CSRF, and the session cookie."""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeAlias
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["CSRF_COOKIE", "SESSION_COOKIE", "Guard", "SignInLimit", "TokenCheck"]

# Request quoted alone (starlette is imported when the dashboard is built): the alias is a type
# at run time, so typing.get_type_hints(dashboard) reads ``str | TokenCheck | None``.
TokenCheck: TypeAlias = Callable[["Request"], Awaitable[str | None] | str | None]
"""The host app's check: given the request, the operator's name, or None to refuse."""

CSRF_COOKIE: Final = "anarchon_csrf"
SESSION_COOKIE: Final = "anarchon_operator"
#: How long an action's message, sealed into the address the action returns to, is shown (s).
MESSAGE_TTL_S: Final = 600
#: Failed sign-ins allowed per client address within :data:`SIGN_IN_WINDOW_S`; more are 429.
SIGN_IN_FAILURES: Final = 5
SIGN_IN_WINDOW_S: Final = 300
#: How long a signed-in session lasts (s); a revoked session is remembered this long.
SESSION_TTL_S: Final = 12 * 3600
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")


def clean_name(text: str) -> str:
    """An operator's name as recorded (``paused by <name>@dashboard``): letters, digits and
    ``._-@``, at most 40 characters; ``operator`` when nothing is left."""
    kept = "".join(c for c in text.strip() if c in _NAME_CHARS)[:40]
    return kept or "operator"


class Guard:
    """Decides who the operator of a request is, and checks CSRF tokens."""

    def __init__(self, token: str | TokenCheck | None) -> None:
        """Check requests against ``token``: None (read-only), the operator token (8 characters
        or more; sessions and messages are sealed under keys drawn from it) or the host app's
        check. TypeError for anything else, ValueError for a shorter token."""
        if token is not None and not isinstance(token, str) and not callable(token):
            raise TypeError(
                f"token={token!r} must be None (read-only), a string or a callable taking the "
                "request and returning the operator's name or None"
            )
        if isinstance(token, str) and len(token) < 8:
            raise ValueError("token must be at least 8 characters (a secret the operator types)")
        self._token = token
        self._key = (
            hashlib.sha256(b"anarchon-dashboard-session\0" + token.encode()).digest()
            if isinstance(token, str)
            else b""
        )
        # Messages are sealed under the token when there is one (so every dashboard process
        # sharing it reads them), else under a key of this process.
        self._message_key = (
            hashlib.sha256(b"anarchon-dashboard-message\0" + token.encode()).digest()
            if isinstance(token, str)
            else secrets.token_bytes(32)
        )
        self._revoked: dict[str, float] = {}
        self.clock: Callable[[], float] = time.time
        """Epoch seconds, for sessions' and messages' ends (tests replace it)."""

    @property
    def writable(self) -> bool:
        """True when some operator may act (a token or a callable is configured)."""
        return self._token is not None

    @property
    def login_form(self) -> bool:
        """True when operators sign in with the token (a string token)."""
        return isinstance(self._token, str)

    def check_token(self, given: str) -> bool:
        """True if ``given`` is the operator token."""
        token = self._token
        return isinstance(token, str) and hmac.compare_digest(given.encode(), token.encode())

    def session_value(self, name: str) -> str:
        """A new session cookie of operator ``name``: the name, a random session id, when it
        ends (epoch s), and their MAC under the token."""
        ends = int(self.clock()) + SESSION_TTL_S
        return self._sealed_session(f"{name}|{secrets.token_hex(8)}|{ends}")

    def _sealed_session(self, body: str) -> str:
        """The session cookie of ``body`` (``name|id|end``): ``body`` and its MAC under the
        token."""
        mac = hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()
        return f"{body}|{mac}"

    def _session(self, value: str) -> tuple[str, str, int] | None:
        """The name, id and end of a genuine session cookie that has not ended, else None."""
        body, _, _ = value.rpartition("|")
        parts = body.split("|")
        if len(parts) != 3 or not parts[0] or not parts[2].isdigit():
            return None
        if not hmac.compare_digest(value, self._sealed_session(body)):
            return None
        name, sid, ends = parts[0], parts[1], int(parts[2])
        if ends <= self.clock() or sid in self._revoked:
            return None
        return name, sid, ends

    def revoke(self, value: str | None) -> str | None:
        """Sign out the session of cookie ``value``: it is refused from now on, in this
        process, until it would have ended anyway. The operator's name, or None if the
        cookie was no live session."""
        session = None if value is None else self._session(value)
        if session is None:
            return None
        name, sid, ends = session
        now = self.clock()
        self._revoked = {k: v for k, v in self._revoked.items() if v > now}
        self._revoked[sid] = ends
        return name

    def seal_message(self, csrf: str, flash: str, warn: str | None) -> str:
        """An action's message for the address it returns to (``?msg=``): readable only by
        the browser holding CSRF cookie ``csrf``, for :data:`MESSAGE_TTL_S` seconds, so a
        link cannot put a message on the dashboard."""
        ends = int(self.clock()) + MESSAGE_TTL_S
        body = base64.urlsafe_b64encode(json.dumps([ends, flash, warn or ""]).encode())
        return body.decode().rstrip("=") + "." + self._message_mac(csrf, body.rstrip(b"="))

    def open_message(self, csrf: str | None, sealed: str | None) -> tuple[str, str]:
        """The ``(flash, warn)`` of :meth:`seal_message`'s ``sealed`` for this browser, or
        empty strings when it is missing, forged, another browser's or too old."""
        if not csrf or not sealed or "." not in sealed:
            return "", ""
        body, _, mac = sealed.rpartition(".")
        if not hmac.compare_digest(mac, self._message_mac(csrf, body.encode())):
            return "", ""
        try:
            ends, flash, warn = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except ValueError:
            return "", ""
        if not isinstance(ends, int) or ends <= self.clock():
            return "", ""
        return str(flash), str(warn)

    def _message_mac(self, csrf: str, body: bytes) -> str:
        """The MAC (32 hex digits) of a sealed message's ``body`` for the browser whose CSRF
        cookie is ``csrf``."""
        signed = csrf.encode() + b"\0" + body
        return hmac.new(self._message_key, signed, hashlib.sha256).hexdigest()[:32]

    def bearer(self, request: Request) -> bool:
        """True if the request carries ``Authorization: Bearer <token>`` with the token."""
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and self.check_token(value.strip())

    async def operator(self, request: Request) -> str | None:
        """The operator's name, or None when the request may only read."""
        token = self._token
        if token is None:
            return None
        if isinstance(token, str):
            if self.bearer(request):
                return "token"
            value = request.cookies.get(SESSION_COOKIE)
            session = None if value is None else self._session(value)
            return None if session is None else session[0]
        found = token(request)
        if inspect.isawaitable(found):
            found = await found
        return None if found is None else clean_name(str(found))


class SignInLimit:
    """Failed sign-ins per client address: past ``failures`` within ``window_s`` seconds, the
    address must wait (a guessed token a few times a minute at most). Kept in this process;
    at most ``addresses`` addresses are remembered (the oldest forgotten first)."""

    def __init__(
        self,
        failures: int = SIGN_IN_FAILURES,
        window_s: float = SIGN_IN_WINDOW_S,
        *,
        addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Allow ``failures`` failed sign-ins per address within ``window_s`` seconds of
        ``clock``, remembering ``addresses`` addresses at most."""
        self.failures = failures
        self.window_s = window_s
        self.addresses = addresses
        self.clock = clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def wait_s(self, address: str) -> int:
        """Seconds ``address`` must wait before it may try again (0: it may now)."""
        times = self._recent(address)
        if len(times) < self.failures:
            return 0
        return max(1, int(times[0] + self.window_s - self.clock()) + 1)

    def failed(self, address: str) -> None:
        """Count a failed sign-in from ``address``."""
        times = self._recent(address)
        times.append(self.clock())
        self._seen[address] = times
        self._seen.move_to_end(address)
        while len(self._seen) > self.addresses:
            self._seen.popitem(last=False)

    def _recent(self, address: str) -> deque[float]:
        """The times (``clock``) ``address`` failed within the window, oldest first; older
        failures are dropped, and an address with none left is forgotten."""
        times = self._seen.get(address, deque())
        while times and times[0] <= self.clock() - self.window_s:
            times.popleft()
        if not times:
            self._seen.pop(address, None)
        return times


def new_csrf() -> str:
    """A fresh CSRF token (the cookie's value; forms carry it back)."""
    return secrets.token_hex(16)


def csrf_ok(request: Request, given: str | None) -> bool:
    """True if the form's CSRF token matches the cookie's and the request comes from this
    site (its ``Origin`` or ``Referer``, when sent, names this host)."""
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not given or not hmac.compare_digest(cookie, given):
        return False
    source = request.headers.get("origin") or request.headers.get("referer")
    if source == "null":
        return False
    if source:
        return urlsplit(source).netloc == request.headers.get("host", "")
    return True
