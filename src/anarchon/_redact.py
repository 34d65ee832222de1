"""The one URL redactor: passwords and tokens never reach a message or a log line.

``redact_url`` takes a URL, a libpq keyword DSN or any message that contains them, and returns it
with each secret replaced by ``***``:

* the password of a URL's user info: ``postgresql://admin:S3cret@db/x`` becomes
  ``postgresql://admin:***@db/x`` (the user name stays: it helps, and it is no secret);
* a NATS token, the user info of ``nats://`` and ``tls://`` URLs without a colon:
  ``nats://s3cr3t@host`` becomes ``nats://***@host``;
* the value of a query parameter or DSN keyword that holds a secret (``password=``, ``token=``,
  ``secret=``, ``sslpassword=``, ``api_key=`` ...);
* ``user:password@host`` written without a scheme.
"""

from __future__ import annotations

import logging
import re
from typing import Final

__all__ = ["MaskedTracebacks", "RedactingFormatter", "redact_url"]

MASK: Final = "***"
# Schemes whose user info alone (no colon) is a secret: a NATS token.
_TOKEN_SCHEMES: Final = frozenset({"nats", "tls", "ws", "wss"})
_URL: Final = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://([^\s'\"<>`]*)")
# A parameter whose value is a secret: password, passwd, pwd, pass, token, *_token, secret,
# *password, api_key, apikey, access_key, nkey seed. Quoted libpq values may hold spaces.
_SECRET_PARAM: Final = re.compile(
    r"(?i)(?<![A-Za-z0-9])"
    r"((?:[A-Za-z0-9_]*password|passwd|pwd|pass|[A-Za-z0-9_]*token|[A-Za-z0-9_]*secret"
    r"|api_?key|access_?key|seed)\s*=\s*)"
    r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,'\"]+)"
)
# user:password@host without a scheme (not the "scheme://" of a URL, handled above).
_BARE_USERINFO: Final = re.compile(r"(?<![\w.:/-])([\w.%+-]+):(?!//)(?!\*\*\*@)([^\s@/'\"]+)@")


def _userinfo(scheme: str, rest: str) -> str:
    """Redact the user info of a URL's part after ``scheme://``."""
    end = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    if at < 0:
        return rest
    info, host = rest[:at], rest[at + 1 :]
    colon = info.find(":")
    if colon >= 0 and not any(c in info[:colon] for c in "/?#"):
        return f"{info[:colon]}:{MASK}@{host}" if info[colon + 1 :] else rest
    if scheme.lower() in _TOKEN_SCHEMES and info and not any(c in info for c in "/?#"):
        return f"{MASK}@{host}"
    return rest


def redact_url(text: str) -> str:
    """Return ``text`` (a URL, a DSN or a message containing them) with every secret masked."""
    if not isinstance(text, str):
        text = str(text)
    text = _URL.sub(lambda m: f"{m.group(1)}://{_userinfo(m.group(1), m.group(2))}", text)
    text = _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, text)
    return _BARE_USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", text)


class RedactingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose output (message and traceback) passes
    :func:`redact_url`: a password inside a driver's error never reaches the log."""

    def format(self, record: logging.LogRecord) -> str:
        """Format as usual, then mask secrets."""
        return redact_url(super().format(record))


class MaskedTracebacks(logging.Filter):
    """A filter for a logger: a record's traceback is formatted here, once, with every secret
    masked, into ``record.exc_text``, which :class:`logging.Formatter` prints instead of
    formatting ``exc_info`` itself. So a handler's exception logged with its traceback shows
    no password, whatever formatter the application chose."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Mask the record's traceback (if it has one); keep every record."""
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_url(_PLAIN.formatException(record.exc_info))
        return True


_PLAIN: Final = logging.Formatter()
