"""NatsBackend's options: checking them, credentials and TLS, the URL form, and keeping secrets
out of text.

Credentials and TLS are nats-py's own (``nats.connect(user=, password=, token=,
user_credentials=, tls=)``): anarchon only checks the options, builds the ``ssl.SSLContext``
from the files named, and passes them on. A password or token never appears in a message, a
``repr`` or a log line: URLs are shown with ``***`` for them, and any text that goes out is
scrubbed of the secret strings this backend knows (:func:`scrub`).

URLs are redacted by the one redactor every backend uses (:func:`anarchon.kit.redact_url`).
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import json
import os
import re
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict
from urllib.parse import parse_qs, unquote, urlsplit

from ...errors import InvalidOption, MissingDependency
from ...kit import HISTORY_SIZE, Bound, check_int, redact_url
from ...kit.urls import bool_option

DEFAULT_SERVERS: Final = "nats://localhost:4222"
MAX_REPLICAS: Final = 5

#: Query parameters of a NATS URL that name files (never secrets themselves).
FILE_OPTIONS: Final = ("ca_file", "cert_file", "key_file", "creds")
INT_OPTIONS: Final = ("duplicate_window_ms", "history_size", "replicas")
TEXT_OPTIONS: Final = ("stream", "prefix")
BOOL_OPTIONS: Final = ("shrink_window",)
URL_OPTIONS: Final = (*TEXT_OPTIONS, *INT_OPTIONS, *BOOL_OPTIONS, *FILE_OPTIONS, "server")


def check_servers(servers: str | Sequence[str]) -> list[str]:
    """The server URLs, stripped: one URL or a non-empty list of them."""
    if isinstance(servers, str):
        servers = [servers]
    if not servers or not all(isinstance(s, str) and s.strip() for s in servers):
        shown = [redact_url(s) if isinstance(s, str) else s for s in servers or []]
        raise InvalidOption(f"servers={shown!r} must be a NATS URL or a non-empty list")
    return [s.strip() for s in servers]


def check_connection(connection: object) -> None:
    """A caller's connection must be a nats-py client."""
    if connection is not None and not callable(getattr(connection, "jetstream", None)):
        raise InvalidOption(f"connection={connection!r} is not a nats-py client (nats.connect)")


def check_access(access: Access, connection: object) -> None:
    """Credentials and TLS must be usable, and are refused with a caller's connection."""
    access.check()
    if connection is not None and access.given:
        raise InvalidOption(
            f"{', '.join(access.given)} apply only when anarchon opens the connection; "
            "with connection=... configure credentials and TLS on your own client"
        )


def check_shrink_window(value: object) -> bool:
    """``shrink_window`` must be True or False."""
    if not isinstance(value, bool):
        raise InvalidOption(f"shrink_window={value!r} must be True or False")
    return value


DUPLICATE_WINDOW: Final = Bound(100, 10 * 365 * 24 * 3600 * 1000, ms=True)
"""The range of ``duplicate_window_ms``: up to 10 years (a job's ``jitter_ms + max_late_ms``
is at most 7 days and 1 hour), far inside JetStream's window, 64-bit nanoseconds."""


def check_window(value: object) -> int:
    """``duplicate_window_ms`` if it is an integer in :data:`DUPLICATE_WINDOW`."""
    return check_int("duplicate_window_ms", value, DUPLICATE_WINDOW, "NatsBackend")


def check_history_size(value: object) -> int:
    """``history_size`` if it is an integer in :data:`~anarchon.kit.HISTORY_SIZE`, every
    backend's range (JetStream would refuse a per-subject limit past 64 bits only as invalid
    JSON when the stream is created)."""
    return check_int("history_size", value, HISTORY_SIZE, "NatsBackend")


def check_at_least(option: str, value: object, minimum: int) -> int:
    """``value`` if it is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidOption(f"{option}={value!r} must be an integer >= {minimum}")
    return value


def check_replicas(replicas: object) -> int | None:
    """None (keep the stream's own) or 1 to :data:`MAX_REPLICAS`."""
    if replicas is None:
        return None
    count = check_at_least("replicas", replicas, 1)
    if count > MAX_REPLICAS:
        raise InvalidOption(
            f"replicas={replicas!r} must be between 1 and {MAX_REPLICAS} (JetStream's limit)"
        )
    return count


def url_secrets(url: str) -> list[str]:
    """The password, or the token (a user part without password), that ``url`` carries: as
    written and percent-decoded."""
    try:
        parts = urlsplit(url)
        secret = parts.password if parts.password is not None else parts.username
    except ValueError:
        return []
    return [secret, unquote(secret)] if secret else []


#: Credentials a URL carries: ``user`` and ``password``, or ``token``.
CREDENTIAL_OPTIONS: Final = ("user", "password", "token", "creds")


def split_credentials(servers: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The server URLs without their user part, and the credentials it held, percent-decoded
    (``nats://admin:p%40ss@host`` is user ``admin``, password ``p@ss``): ``user`` and
    ``password``, or ``token`` (a user part without ``:``), or nothing.

    Raise :class:`InvalidOption` for a user part with an empty user, password or token, and for
    servers whose URLs carry different credentials (one connection uses one set).
    """
    bare: list[str] = []
    found: dict[str, str] = {}
    for url in servers:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        userinfo, at, hostport = parts.netloc.rpartition("@")
        if not at:
            bare.append(url)
            continue
        shown = redact_url(parts._replace(query="", fragment="").geturl())
        bare.append(parts._replace(netloc=hostport).geturl())
        user, colon, password = (unquote(x) for x in userinfo.partition(":"))
        if not colon:
            if not user:
                raise InvalidOption(f"server URL {shown!r} has an empty token before '@'")
            creds = {"token": user}
        elif not user:
            raise InvalidOption(
                f"server URL {shown!r} has a password without a user name (nats://user:password@host)"
            )
        elif not password:
            raise InvalidOption(
                f"server URL {shown!r}: user {user!r} has an empty password; a user goes with "
                "its password (nats://user:password@host), a token alone is nats://token@host"
            )
        else:
            creds = {"user": user, "password": password}
        if found and creds != found:
            raise InvalidOption(
                f"server URL {shown!r} carries other credentials than the server before it; "
                "one connection uses one set: give the same in each URL, or as options"
            )
        found = creds
    return bare, found


def merge_credentials(options: AccessKwargs, from_url: dict[str, str]) -> AccessKwargs:
    """``options`` with the credentials a URL carried (:func:`split_credentials`); refused
    with :class:`InvalidOption` when ``options`` give credentials too."""
    if not from_url:
        return options
    given = [name for name in CREDENTIAL_OPTIONS if options.get(name) is not None]
    if given:
        carried = "a token" if "token" in from_url else "a user and password"
        raise InvalidOption(
            f"give one kind of NATS credentials: the server URL carries {carried} and "
            f"{', '.join(f'{name}=' for name in given)} is given too"
        )
    merged: dict[str, Any] = {**options, **from_url}
    return merged  # type: ignore[return-value]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class AccessKwargs(TypedDict, total=False):
    """:class:`Access`'s fields, as :class:`~anarchon.backends.nats.NatsBackend` takes them."""

    user: str | None
    password: str | None
    token: str | None
    creds: str | None
    ca_file: str | None
    cert_file: str | None
    key_file: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Access:
    """Credentials and TLS settings for a connection anarchon opens itself.

    Exactly one kind of credentials at most: ``user`` + ``password``, ``token``, or a ``.creds``
    file (a user JWT and its nkey seed, as ``nsc`` writes them). TLS: ``ca_file`` to trust the
    server's certificate authority, ``cert_file`` (+ ``key_file`` unless the key is in the
    same PEM file) for a client certificate.
    """

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def given(self) -> list[str]:
        """Names of the options that are set."""
        return [name for name in self.__slots__ if getattr(self, name) is not None]

    @property
    def secrets(self) -> list[str]:
        """The strings never to print."""
        return [s for s in (self.password, self.token) if s]

    def check(self) -> None:
        """Raise :class:`InvalidOption` (or :class:`MissingDependency`) for unusable settings."""
        for name in ("user", "password", "token"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                shown = "***" if name != "user" and isinstance(value, str) else repr(value)
                raise InvalidOption(f"{name}={shown} must be a non-empty string")
        if (self.password is None) != (self.user is None):
            missing = "password" if self.password is None else "user"
            raise InvalidOption(
                f"user and password go together; {missing} is missing (for a token alone use "
                "token=...)"
            )
        kinds = [k for k in ("user", "token", "creds") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise InvalidOption(
                f"give one kind of NATS credentials, not {' and '.join(kinds)}: user + password, "
                "token, or a creds file"
            )
        for name in FILE_OPTIONS:
            _check_file(name, getattr(self, name))
        if self.key_file is not None and self.cert_file is None:
            raise InvalidOption(
                f"key_file={self.key_file!r} needs cert_file (the client certificate it signs for)"
            )
        if self.creds is not None and importlib.util.find_spec("nkeys") is None:
            raise MissingDependency(
                f"creds={self.creds!r}: signing with a .creds file needs the nkeys package: "
                "pip install 'nats-py[nkeys]'"
            )
        if self.creds is not None:
            _check_creds(str(self.creds))

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``ca_file`` / ``cert_file``, or None to leave TLS to nats-py
        (a ``tls://`` URL then trusts the system's certificate authorities)."""
        if self.ca_file is None and self.cert_file is None:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidOption(
                f"ca_file={self.ca_file!r} holds no usable CA certificate (PEM): {_why(exc)}"
            ) from None
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                key = f" with key_file={self.key_file!r}" if self.key_file else ""
                raise InvalidOption(
                    f"cert_file={self.cert_file!r}{key} is not a usable client certificate and "
                    f"key (PEM, key unencrypted): {_why(exc)}"
                ) from None
        return context

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (credentials and TLS only)."""
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"], options["password"] = self.user, self.password
        if self.token is not None:
            options["token"] = self.token
        if self.creds is not None:
            options["user_credentials"] = self.creds
        context = self.tls_context()
        if context is not None:
            options["tls"] = context
        return options


def _check_file(name: str, path: object) -> None:
    if path is None:
        return
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise InvalidOption(f"{name}={path!r} must be the path of a file")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise InvalidOption(f"{name}={str(path)!r} is not a readable file")


_JWT_BLOCK: Final = re.compile(r"-----BEGIN NATS USER JWT-----\s*\n\s*(\S+)")
_SEED_BLOCK: Final = re.compile(r"-----BEGIN USER NKEY SEED-----\s*\n\s*(\S+)")


def _check_creds(path: str) -> None:
    """A ``.creds`` file must hold a user JWT (three base64url parts, JSON header and claims)
    and a user nkey seed that nkeys reads; the message never shows either."""
    import nkeys  # type: ignore[import-untyped]

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(1 << 20)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidOption(f"creds={path!r} is not a readable text file: {_why(exc)}") from None
    rule = "(a .creds file as nsc writes it: a NATS USER JWT block and a USER NKEY SEED block)"
    jwt = _JWT_BLOCK.search(text)
    if jwt is None or not _is_jwt(jwt.group(1)):
        raise InvalidOption(f"creds={path!r} holds no usable user JWT {rule}")
    seed = _SEED_BLOCK.search(text)
    try:
        if seed is None or not seed.group(1).startswith("SU"):
            raise ValueError
        nkeys.from_seed(bytearray(seed.group(1).encode())).wipe()
    except Exception:
        raise InvalidOption(f"creds={path!r} holds no usable user nkey seed {rule}") from None


def _is_jwt(text: str) -> bool:
    parts = text.split(".")
    if len(parts) != 3 or not all(parts):
        return False
    try:
        for part in parts[:2]:
            if not isinstance(
                json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))), dict
            ):
                return False
    except (ValueError, binascii.Error):
        return False
    return True


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
    return str(reason)


@dataclass(frozen=True, slots=True)
class ParsedUrl:
    """A NATS backend URL taken apart: the server URLs and the constructor's keyword options."""

    servers: list[str]
    options: dict[str, Any]


def parse_url(url: str) -> ParsedUrl:
    """Take apart ``nats://[user:password@]h1:4222[,h2:4222][/]?stream=...&ca_file=...``.

    Raise :class:`InvalidOption` naming the problem. Messages show the URL redacted and without
    its query, and name unknown options without their values (one may be a misspelt secret).
    """
    shown = redact_url(url.split("?", 1)[0])
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("nats", "tls"):
        raise InvalidOption(f"backend URL {shown!r} is not a nats:// or tls:// URL")
    if parts.path not in ("", "/"):
        raise InvalidOption(
            f"backend URL {shown!r} has a path {parts.path!r}; NATS URLs take options as query "
            "parameters: nats://host:4222?stream=CRON&prefix=cron."
        )
    userinfo, _, hosts = parts.netloc.rpartition("@")
    auth = f"{userinfo}@" if userinfo else ""
    servers = [f"{parts.scheme}://{auth}{h}" for h in hosts.split(",") if h.strip()]
    params = parse_qs(parts.query, keep_blank_values=True)
    servers += params.pop("server", [])
    unknown = sorted(set(params) - set(URL_OPTIONS))
    if unknown:
        raise InvalidOption(
            f"backend URL {shown!r} has unknown option(s) {', '.join(unknown)}; NATS URLs take "
            f"{', '.join(URL_OPTIONS)} (credentials go before the host: "
            "nats://user:password@host or nats://token@host)"
        )
    options: dict[str, Any] = {}
    for key, values in params.items():
        options[key] = _option(shown, key, values[-1])
    if not servers:
        raise InvalidOption(f"backend URL {shown!r} names no server (nats://host:4222)")
    return ParsedUrl(servers, options)


def _option(shown: str, key: str, value: str) -> Any:
    if key in INT_OPTIONS:
        try:
            return int(value)
        except ValueError:
            raise InvalidOption(
                f"backend URL {shown!r}: {key}={value!r} must be an integer"
            ) from None
    if key in BOOL_OPTIONS:
        return bool_option(key, value, shown)
    return value


def servers_shown(servers: Sequence[str]) -> str:
    """The server URLs, redacted, for a message."""
    return ", ".join(redact_url(s) for s in servers)
