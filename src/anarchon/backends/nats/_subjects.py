"""Every name the NATS backend puts on the wire: subjects, message ids, headers, API subjects.

Each is a template here (fill it with ``.format(prefix=..., job=...)``), so what is stored where
reads in one table. Under the prefix (``cron.`` by default) a job has two subjects, both covered
by the stream's one subject ``<prefix>>``::

    <prefix><job>.claims    one message per claimed run (scheduled, skipped or manual)
    <prefix><job>.results   one message per finished run
    <prefix>_clock          a probe for the server's clock on servers older than 2.10, deleted
                            right after it is read (one token, so it never matches a job)

and, outside the stream (core NATS, not stored), ``_anarchon.<stream>.claimed`` carries the
claim notices (``Backend.subscribe_claims``): JSON lists ``[job, slot_key, instance, null]``.

A claim's ``Nats-Msg-Id`` is ``<job>:<slot>`` (``<job>:manual-<run_id>`` for a manual run), the
same on every instance, so JetStream's de-duplication picks the first. A result's id is
``<job>:<slot_key>:result``, so a retried publish is stored once.

JetStream de-duplicates across the whole stream, so two prefixes sharing a stream, each with a
job of the same name, would share those ids. An instance whose claim is a duplicate of a message
stored on *another* prefix's subject publishes it again under ``<prefix><job>:<slot>``
(:data:`OWN_CLAIM_ID`), and so does every other instance of its prefix: the first id still
decides for its own prefix (an older instance, which knows only the first id, and a newer one
race on it as before), and the second decides only when the first is another prefix's. Results
do the same (:data:`OWN_RESULT_ID`). Claim notices of a prefix other than the default go to
``_anarchon.<stream>.<prefix>claimed``, so that one prefix's wins are not heard by another.
"""

from __future__ import annotations

import re
from typing import Final

from ...errors import InvalidOption

MSG_ID: Final = "Nats-Msg-Id"
"""The header that carries a message id."""
ALL: Final = "{prefix}>"
"""The one subject the stream needs: everything under the prefix."""
CLAIMS: Final = "{prefix}{job}.claims"
"""Where the claims of a job are published."""
RESULTS: Final = "{prefix}{job}.results"
"""Where the results of a job are published."""
ALL_CLAIMS: Final = "{prefix}*.claims"
"""A consumer filter for the claims of every job (see :mod:`._readback`)."""
JOB: Final = "{prefix}{job}.*"
"""A consumer filter for both subjects of a job (one wildcard: 2.9 has no multi-filter)."""
CLAIMED: Final = "_anarchon.{stream}.claimed"
"""Where won claims are announced (core NATS: not stored, not in the stream)."""
CLOCK: Final = "{prefix}_clock"
"""The clock probe's subject."""
CLAIM_ID: Final = "{job}:{slot_key}"
"""A claim's ``Nats-Msg-Id``: ``<job>:<slot>`` or ``<job>:manual-<run_id>``."""
RESULT_ID: Final = "{job}:{slot_key}:result"
"""A result's ``Nats-Msg-Id``."""
OWN_CLAIM_ID: Final = "{prefix}{job}:{slot_key}"
"""A claim's second id, used only when the stream holds another prefix's claim under
:data:`CLAIM_ID` (a stream shared by two prefixes with a job of the same name)."""
OWN_RESULT_ID: Final = "{prefix}{job}:{slot_key}:result"
"""A result's second id, used only when another prefix's result holds :data:`RESULT_ID`."""
PREFIX_CLAIMED: Final = "_anarchon.{stream}.{prefix}claimed"
"""Where won claims are announced under a prefix other than the default (see :data:`CLAIMED`)."""
API: Final = "$JS.API.{verb}.{stream}"
"""A JetStream API subject, e.g. ``$JS.API.STREAM.INFO.CRON``."""
CONSUMER_DELETE: Final = "$JS.API.CONSUMER.DELETE.{stream}.{consumer}"
"""The JetStream API subject that deletes a consumer."""

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
