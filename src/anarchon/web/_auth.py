"""Who may act: an operator token (or the host app's callable), CSRF, and the session cookie."""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeAlias
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["CSRF_COOKIE", "SESSION_COOKIE", "Guard", "TokenCheck"]

TokenCheck: TypeAlias = "Callable[[Request], Awaitable[str | None] | str | None]"
"""The host app's check: given the request, the operator's name, or None to refuse."""

CSRF_COOKIE: Final = "anarchon_csrf"
SESSION_COOKIE: Final = "anarchon_operator"
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")


def clean_name(text: str) -> str:
    """An operator's name as recorded (``paused by <name>@dashboard``): letters, digits and
    ``._-@``, at most 40 characters; ``operator`` when nothing is left."""
    kept = "".join(c for c in text.strip() if c in _NAME_CHARS)[:40]
    return kept or "operator"


class Guard:
    """Decides who the operator of a request is, and checks CSRF tokens."""

    def __init__(self, token: str | TokenCheck | None) -> None:
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
        """The session cookie of operator ``name``: the name and its MAC under the token."""
        mac = hmac.new(self._key, name.encode(), hashlib.sha256).hexdigest()
        return f"{name}|{mac}"

    def _from_session(self, value: str) -> str | None:
        name, _, _ = value.partition("|")
        if name and hmac.compare_digest(value, self.session_value(name)):
            return name
        return None

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
            return None if value is None else self._from_session(value)
        found = token(request)
        if inspect.isawaitable(found):
            found = await found
        return None if found is None else clean_name(str(found))


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
