"""Creating the stream, or evolving an existing one, in ``start()``.

The configuration travels as the server's own JSON: an existing stream's config is read back
whole, the few fields anarchon owns are changed, and the whole config is sent back. So fields
this client library does not know (newer servers add some) keep their values, and nothing is
reset to a default by accident.

Rules (the seed's, plus "never delete user data"):

* absent: created with subjects ``<prefix>>``, the duplicate window, ``max_msgs_per_subject =
  history_size`` and ``replicas`` (1 when not given).
* present: the duplicate window is set; ``<prefix>>`` is added unless a subject already covers it
  (subjects it covers are folded into it, since JetStream refuses overlapping subjects in one
  stream, and everything they captured stays captured); ``num_replicas`` changes only when
  ``replicas`` was given; everything else is kept.
* the per-subject limit is set to ``history_size`` when the stream holds only anarchon's subjects.
  On a stream that also captures other subjects, lowering the limit would delete their
  messages, so it is only raised, never lowered (history then keeps more runs, which the seed's
  "at least" allows).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from ...errors import BackendError
from . import _errors as errors
from . import _subjects as subjects
from ._errors import JetStreamError

logger = logging.getLogger(__name__)

Api = Callable[[str, "dict[str, Any] | None"], Awaitable[dict[str, Any]]]

NS_PER_MS: Final = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Wanted:
    """What the backend's options ask of the stream."""

    stream: str
    prefix: str
    duplicate_window_ms: int
    history_size: int
    replicas: int | None


async def ensure(api: Api, wanted: Wanted) -> dict[str, Any]:
    """Create or evolve the stream; return its info as the server reports it afterwards."""
    info = await _info(api, wanted.stream)
    if info is None:
        info = await _create(api, wanted)
    config: dict[str, Any] = info.get("config") or {}
    _check_usable(config, wanted)
    changes, new = evolve(config, wanted)
    if wanted.replicas is not None and wanted.replicas > 1 and not _clustered(info):
        raise BackendError(
            f"replicas={wanted.replicas} needs a NATS cluster, but the server holding stream "
            f"{wanted.stream!r} is not clustered: leave replicas unset (1) on a single server"
        )
    if not changes:
        return info
    try:
        updated = await api(subjects.api("STREAM.UPDATE", wanted.stream), new)
    except JetStreamError as exc:
        raise _explain(exc, wanted, "update") from exc
    logger.info(
        "updated stream %s: %s",
        wanted.stream,
        "; ".join(changes),
        extra={"action": "stream_updated", "stream": wanted.stream},
    )
    return updated


def evolve(config: dict[str, Any], wanted: Wanted) -> tuple[list[str], dict[str, Any]]:
    """Return the changes anarchon needs (as text) and the whole new config."""
    new = dict(config)
    changes: list[str] = []
    mine = subjects.stream_subject(wanted.prefix)
    current: list[str] = list(config.get("subjects") or [])
    if not any(subjects.covers(s, mine) for s in current):
        folded = [s for s in current if subjects.covers(mine, s)]
        new["subjects"] = [s for s in current if s not in folded] + [mine]
        changes.append(
            f"added subject {mine}" + (f" (covering {', '.join(folded)})" if folded else "")
        )
    window = wanted.duplicate_window_ms * NS_PER_MS
    if config.get("duplicate_window") != window:
        new["duplicate_window"] = window
        changes.append(
            f"duplicate window {(config.get('duplicate_window') or 0) // NS_PER_MS} ms -> "
            f"{wanted.duplicate_window_ms} ms"
        )
    limit = _limit(config, list(new.get("subjects") or []), wanted)
    if limit is not None:
        new["max_msgs_per_subject"] = limit
        changes.append(f"per-subject limit {config.get('max_msgs_per_subject', -1)} -> {limit}")
    if wanted.replicas is not None and config.get("num_replicas") != wanted.replicas:
        new["num_replicas"] = wanted.replicas
        changes.append(f"replicas {config.get('num_replicas')} -> {wanted.replicas}")
    return changes, new


def _limit(config: dict[str, Any], stream_subjects: list[str], wanted: Wanted) -> int | None:
    """The new per-subject limit, or None to keep the current one."""
    current = int(config.get("max_msgs_per_subject") or -1)
    if current == wanted.history_size:
        return None
    mine = subjects.stream_subject(wanted.prefix)
    alone = all(subjects.covers(mine, s) for s in stream_subjects)
    if alone:
        return wanted.history_size
    if 0 < current < wanted.history_size:
        return wanted.history_size
    logger.info(
        "stream %s also holds subjects other than %s; its per-subject limit %s is kept (not "
        "lowered to history_size=%d, which would delete their messages)",
        wanted.stream,
        mine,
        "unlimited" if current <= 0 else current,
        wanted.history_size,
        extra={"action": "stream_limit_kept", "stream": wanted.stream},
    )
    return None


async def require(api: Api, stream: str) -> dict[str, Any]:
    """Return the stream's info, unchanged; raise if it does not exist (read-only opening)."""
    info = await _info(api, stream)
    if info is None:
        raise BackendError(
            f"JetStream stream {stream!r} does not exist, so it holds no history; check the "
            "stream name (the backend URL's ?stream=...)"
        )
    return info


async def _info(api: Api, stream: str) -> dict[str, Any] | None:
    try:
        return await api(subjects.api("STREAM.INFO", stream), None)
    except JetStreamError as exc:
        if exc.err_code == errors.STREAM_NOT_FOUND:
            return None
        raise


async def _create(api: Api, wanted: Wanted) -> dict[str, Any]:
    config = {
        "name": wanted.stream,
        "subjects": [subjects.stream_subject(wanted.prefix)],
        "retention": "limits",
        "storage": "file",
        "discard": "old",
        "num_replicas": wanted.replicas or 1,
        "duplicate_window": wanted.duplicate_window_ms * NS_PER_MS,
        "max_msgs_per_subject": wanted.history_size,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msg_size": -1,
        "max_consumers": -1,
    }
    try:
        info = await api(subjects.api("STREAM.CREATE", wanted.stream), config)
    except JetStreamError as exc:
        if exc.err_code == errors.STREAM_NAME_IN_USE:
            # Another instance created it at the same moment, with other settings: evolve it.
            again = await _info(api, wanted.stream)
            if again is not None:
                return again
        raise _explain(exc, wanted, "create") from exc
    logger.info(
        "created stream %s (subjects %s, duplicate window %d ms, %d messages per subject, R%d)",
        wanted.stream,
        subjects.stream_subject(wanted.prefix),
        wanted.duplicate_window_ms,
        wanted.history_size,
        config["num_replicas"],
        extra={"action": "stream_created", "stream": wanted.stream},
    )
    return info


def _check_usable(config: dict[str, Any], wanted: Wanted) -> None:
    name = wanted.stream
    problem = None
    max_age_ms = int(config.get("max_age") or 0) // NS_PER_MS
    if 0 < max_age_ms < wanted.duplicate_window_ms:
        raise BackendError(
            f"duplicate_window_ms={wanted.duplicate_window_ms} is longer than the max_age of "
            f"stream {name!r} ({max_age_ms} ms), and JetStream keeps the window within max_age: "
            "lower duplicate_window_ms (every job's jitter_ms + max_late_ms must stay below it) "
            "or raise the stream's max_age"
        )
    if config.get("retention", "limits") != "limits":
        problem = (
            f"uses retention {config.get('retention')!r}, which removes messages anarchon still "
            "needs; it needs 'limits' retention"
        )
    elif config.get("mirror"):
        problem = "is a mirror, which cannot take publishes"
    elif config.get("sealed"):
        problem = "is sealed, which refuses new messages"
    elif config.get("no_ack"):
        problem = "has no_ack set, so publishes get no ack and no winner can be told"
    if problem is not None:
        raise BackendError(
            f"stream {name!r} {problem}. Use another stream name (NatsBackend(stream=...)) and "
            "let anarchon create it"
        )


def _clustered(info: dict[str, Any]) -> bool:
    cluster = info.get("cluster") or {}
    return bool(cluster.get("name"))


def _explain(exc: JetStreamError, wanted: Wanted, action: str) -> BackendError:
    stream, mine = wanted.stream, subjects.stream_subject(wanted.prefix)
    code = exc.err_code
    if code == errors.SUBJECTS_OVERLAP:
        why = (
            f"its subject {mine} overlaps the subjects of another stream. Choose another prefix, "
            "or use that stream's name as stream="
        )
    elif code == errors.REPLICAS_NOT_CLUSTERED:
        why = (
            f"replicas={wanted.replicas} needs a NATS cluster and this server is not clustered; "
            "leave replicas unset on a single server"
        )
    elif code == errors.NO_SUITABLE_PEERS:
        why = f"the cluster has fewer JetStream servers than replicas={wanted.replicas} ({exc})"
    elif code == errors.WINDOW_VS_MAX_AGE:
        why = (
            f"{exc}. The duplicate window (duplicate_window_ms={wanted.duplicate_window_ms}) must "
            "be at least 100 ms and at most the stream's max_age"
        )
    elif code in (errors.JETSTREAM_NOT_ENABLED, errors.JETSTREAM_NOT_ENABLED_FOR_ACCOUNT):
        why = f"{exc}: enable JetStream (nats-server -js) for this account"
    else:
        why = str(exc)
    return BackendError(f"NATS refused to {action} stream {stream!r}: {why}")
