"""Every name the NATS backend puts on the wire: subjects, message ids, headers, API subjects.

Under the prefix (``cron.`` by default) a job has two subjects, both covered by the stream's
one subject ``<prefix>>``::

    <prefix><job>.claims    one message per claimed run (scheduled, skipped or manual)
    <prefix><job>.results   one message per finished run
    <prefix>_clock          a probe for the server's clock on servers older than 2.10, deleted
                            right after it is read (one token, so it never matches a job)

A claim's ``Nats-Msg-Id`` is ``<job>:<slot>`` (``<job>:manual-<run_id>`` for a manual run), the
same on every instance, so JetStream's de-duplication picks the first. A result's id is
``<job>:<slot_key>:result``, so a retried publish is stored once.
"""

from __future__ import annotations

import re
from typing import Final

from ...errors import InvalidOption

MSG_ID: Final = "Nats-Msg-Id"
CLAIMS: Final = "claims"
RESULTS: Final = "results"
CLOCK: Final = "_clock"
API: Final = "$JS.API"

# NATS subject tokens may hold any printable character but '.', '*', '>' and whitespace.
_TOKEN: Final = r"(?:(?![.*>])[!-~])+"
PREFIX_RULE: Final = re.compile(rf"(?:{_TOKEN}\.)+")
# Stream names also go into API subjects, and the server refuses path separators in them.
STREAM_RULE: Final = re.compile(r"(?:(?![.*>/\\])[!-~]){1,255}")
RESERVED_PREFIXES: Final = ("$", "_INBOX.")


def check_stream(stream: object) -> str:
    """Return ``stream`` if JetStream can take it as a stream name, else raise InvalidOption."""
    if not isinstance(stream, str) or not STREAM_RULE.fullmatch(stream):
        raise InvalidOption(
            f"stream={stream!r} is not a JetStream stream name: use 1 to 255 printable ASCII "
            "characters without spaces, '.', '*', '>', '/' or '\\' (for example 'CRON')"
        )
    return stream


def check_prefix(prefix: object) -> str:
    """Return ``prefix`` if it can start NATS subjects, else raise InvalidOption."""
    if not isinstance(prefix, str) or not PREFIX_RULE.fullmatch(prefix):
        raise InvalidOption(
            f"prefix={prefix!r} is not a NATS subject prefix: use one or more subject tokens, "
            "each followed by '.', without spaces, '*' or '>' (for example 'cron.' or "
            "'billing.cron.')"
        )
    if prefix.startswith(RESERVED_PREFIXES):
        raise InvalidOption(
            f"prefix={prefix!r} starts with a subject NATS reserves ('$...', '_INBOX.'); a "
            "stream capturing it would swallow system or reply messages. Use e.g. 'cron.'"
        )
    return prefix


def stream_subject(prefix: str) -> str:
    """The one subject the stream needs: everything under the prefix."""
    return f"{prefix}>"


def claims(prefix: str, job: str) -> str:
    """Where the claims of ``job`` are published."""
    return f"{prefix}{job}.{CLAIMS}"


def results(prefix: str, job: str) -> str:
    """Where the results of ``job`` are published."""
    return f"{prefix}{job}.{RESULTS}"


def job_filter(prefix: str, job: str) -> str:
    """A consumer filter for both subjects of ``job`` (one wildcard: 2.9 has no multi-filter)."""
    return f"{prefix}{job}.*"


def clock(prefix: str) -> str:
    """The clock probe's subject."""
    return f"{prefix}{CLOCK}"


def claim_id(job: str, slot_key: str) -> str:
    """The claim's ``Nats-Msg-Id``: ``<job>:<slot>`` or ``<job>:manual-<run_id>``."""
    return f"{job}:{slot_key}"


def result_id(job: str, slot_key: str) -> str:
    """The result's ``Nats-Msg-Id``."""
    return f"{job}:{slot_key}:result"


def api(verb: str, stream: str) -> str:
    """A JetStream API subject, e.g. ``$JS.API.STREAM.INFO.CRON``."""
    return f"{API}.{verb}.{stream}"


def covers(pattern: str, subject: str) -> bool:
    """True if every subject matching ``subject`` (which may hold wildcards) matches ``pattern``."""
    want, have = subject.split("."), pattern.split(".")
    for n, token in enumerate(have):
        if token == ">":
            return n < len(want)
        # A '>' in the subject spans tokens that only a '>' in the pattern can cover.
        if n >= len(want) or want[n] == ">":
            return False
        if token not in ("*", want[n]):
            return False
    return len(have) == len(want)
