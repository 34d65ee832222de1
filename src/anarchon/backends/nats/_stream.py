"""Creating the stream, or evolving an existing one, in ``start()``.

The configuration travels as the server's own JSON: an existing stream's config is read back
whole, the few fields anarchon owns are changed, and the whole config is sent back. So fields
this client library does not know (newer servers add some) keep their values, and nothing is
reset to a default by accident.

Rules (the seed's, plus "never delete user data"):

* absent: created with subjects ``<prefix>>``, the duplicate window, ``max_msgs_per_subject =
  history_size``, ``replicas`` (1 when not given) and, on nats-server 2.10+, a first sequence
  of ``server time in ms x 1024`` (:func:`fence_floor`), so that the fences (claim sequences) of
  a stream created again under the same name start above every fence of the one before.
* present: the duplicate window grows to ``duplicate_window_ms`` and is never shrunk (several
  instances may start with different values; the largest wins, whatever the order they start
  in), unless ``shrink_window`` asks for exactly ``duplicate_window_ms``; ``<prefix>>`` is added
  unless a subject already covers it
  (subjects it covers are folded into it, since JetStream refuses overlapping subjects in one
  stream, and everything they captured stays captured); ``num_replicas`` changes only when
  ``replicas`` was given; everything else is kept.
* the per-subject limit is set to ``history_size`` when the stream holds only anarchon's subjects.
  On a stream that also captures other subjects, lowering the limit would delete their
  messages, so it is only raised, never lowered (history then keeps more runs, which the seed's
  "at least" allows).

A stream lost under running instances is made again by :mod:`._guard` through
:func:`recreate`: the config a new stream gets here, created only if it is still missing.

The key-value buckets beside the stream (its instances, job definitions, pauses and run requests)
follow the stream's replicas: a bucket is created with them, and an existing one whose replicas
differ is updated to them in ``start()`` (:func:`align_buckets`). Otherwise an R3 stream in a
cluster would have R1 buckets, and the loss of the one server holding the control bucket would
stop every claim (the pause check fails closed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ...errors import BackendError
from ...kit import Action, log_fields
from . import _errors as errors
from . import _subjects as subjects
from ._errors import JetStreamError
from ._records import parse_time_ms

logger = logging.getLogger("anarchon.backends.nats")

Api = Callable[[str, "dict[str, Any] | None"], Awaitable[dict[str, Any]]]

NS_PER_MS: Final = 1_000_000
#: The server's own default window, which a config of 0 means.
SERVER_DEFAULT_WINDOW_MS: Final = 120_000
#: A new stream's first sequence is the server's time in ms times this. Sequences of the stream
#: before (same name, deleted) stay below it as long as it stored fewer than 1024 messages per
#: millisecond of its life, about a million a second; and the floor stays below 2**53 (exact in
#: JSON readers that use doubles) until the year 2248.
FENCE_FLOOR_PER_MS: Final = 1024
#: Warn when the host that sets a new stream's first sequence is this far off the server.
FLOOR_SKEW_WARN_MS: Final = 5_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Wanted:
    """What the backend's options ask of the stream."""

    stream: str
    prefix: str
    duplicate_window_ms: int
    history_size: int
    replicas: int | None
    shrink_window: bool = False
    fence_floor: bool = True
    """Start a new stream's sequence at :func:`fence_floor` (servers 2.10+ take first_seq)."""


def window_ms(info: dict[str, Any]) -> int:
    """The duplicate window, in ms, of a stream info answer."""
    window = int((info.get("config") or {}).get("duplicate_window") or 0) // NS_PER_MS
    return window or SERVER_DEFAULT_WINDOW_MS


async def ensure(api: Api, wanted: Wanted) -> dict[str, Any]:
    """Create or evolve the stream; return its info as the server reports it afterwards."""
    info = await find(api, wanted.stream)
    if info is None:
        info, _ = await _create(api, wanted)
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
        updated = await api(subjects.API.format(verb="STREAM.UPDATE", stream=wanted.stream), new)
    except JetStreamError as exc:
        raise _explain(exc, wanted, "update") from exc
    logger.info(
        "updated stream %s: %s",
        wanted.stream,
        "; ".join(changes),
        extra=log_fields(Action.STREAM_UPDATED, stream=wanted.stream),
    )
    return updated


def evolve(config: dict[str, Any], wanted: Wanted) -> tuple[list[str], dict[str, Any]]:
    """Return the changes anarchon needs (as text) and the whole new config."""
    new = dict(config)
    changes: list[str] = []
    mine = subjects.ALL.format(prefix=wanted.prefix)
    current: list[str] = list(config.get("subjects") or [])
    if not any(subjects.covers(s, mine) for s in current):
        folded = [s for s in current if subjects.covers(mine, s)]
        new["subjects"] = [s for s in current if s not in folded] + [mine]
        changes.append(
            f"added subject {mine}" + (f" (covering {', '.join(folded)})" if folded else "")
        )
    have_ms, want = window_ms({"config": config}), wanted.duplicate_window_ms
    if have_ms < want or (have_ms > want and wanted.shrink_window):
        new["duplicate_window"] = want * NS_PER_MS
        why = "grown" if have_ms < want else "shrunk, as shrink_window=True asks"
        changes.append(f"duplicate window {have_ms} ms -> {want} ms ({why})")
    elif have_ms > want:
        logger.info(
            "stream %s keeps its duplicate window of %d ms, longer than duplicate_window_ms=%d: "
            "windows only grow (another instance asked for more; shrink_window=True to shrink)",
            wanted.stream,
            have_ms,
            want,
            extra=log_fields(Action.STREAM_WINDOW_KEPT, stream=wanted.stream),
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
    mine = subjects.ALL.format(prefix=wanted.prefix)
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
        extra=log_fields(Action.STREAM_LIMIT_KEPT, stream=wanted.stream),
    )
    return None


async def require(api: Api, stream: str) -> dict[str, Any]:
    """Return the stream's info, unchanged; raise if it does not exist (read-only opening)."""
    info = await find(api, stream)
    if info is None:
        raise BackendError(
            f"JetStream stream {stream!r} does not exist, so it holds no history; check the "
            "stream name (the backend URL's ?stream=...). If schedulers run on it, it was "
            "deleted or its server lost its store: the history it held is gone, and they "
            "create it again, empty, one duplicate window after they notice (their claims fail "
            "closed until then)"
        )
    return info


PREFIX_MISSING: Final = "holds no subject under prefix"
"""Words of the error :func:`require_prefix` raises (the commands answer it as "no anarchon
data")."""


def require_prefix(info: dict[str, Any], wanted: Wanted) -> None:
    """Raise (read-only opening) unless the stream's subjects cover the prefix's: a scheduler
    adds its prefix's subject when it starts, so a stream without it holds nothing of that
    prefix (a mistyped ``?prefix=``, or the default ``cron.`` where schedulers use another)."""
    mine = subjects.ALL.format(prefix=wanted.prefix)
    current = [str(s) for s in (info.get("config") or {}).get("subjects") or []]
    if any(subjects.covers(s, mine) for s in current):
        return
    raise BackendError(
        f"JetStream stream {wanted.stream!r} {PREFIX_MISSING} {wanted.prefix!r} (its subjects: "
        f"{', '.join(current) or 'none'}), so no scheduler with this prefix ever ran on it; "
        "check the prefix (the backend URL's ?prefix=..., 'cron.' when left out)"
    )


async def find(api: Api, stream: str) -> dict[str, Any] | None:
    """The info of stream ``stream`` (a key-value bucket's is ``KV_<bucket>``); None if it does
    not exist. Any other failure is raised."""
    try:
        return await api(subjects.API.format(verb="STREAM.INFO", stream=stream), None)
    except JetStreamError as exc:
        if exc.err_code == errors.STREAM_NOT_FOUND:
            return None
        raise


async def recreate(api: Api, wanted: Wanted) -> tuple[dict[str, Any], bool]:
    """Create the stream as :func:`ensure` creates a new one, unless it exists (then it is left
    as it is); its info, and True if this call created it."""
    info = await find(api, wanted.stream)
    if info is not None:
        return info, False
    return await _create(api, wanted)


async def _create(api: Api, wanted: Wanted) -> tuple[dict[str, Any], bool]:
    """Create the stream; its info, and False if another instance created it meanwhile."""
    floor = fence_floor() if wanted.fence_floor else None
    config: dict[str, Any] = {
        "name": wanted.stream,
        "subjects": [subjects.ALL.format(prefix=wanted.prefix)],
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
    if floor is not None:
        config["first_seq"] = floor
    try:
        info = await api(subjects.API.format(verb="STREAM.CREATE", stream=wanted.stream), config)
    except JetStreamError as exc:
        if exc.err_code == errors.STREAM_NAME_IN_USE:
            # Another instance created it at the same moment, with other settings: evolve it.
            again = await find(api, wanted.stream)
            if again is not None:
                return again, False
        raise _explain(exc, wanted, "create") from exc
    logger.info(
        "created stream %s (subjects %s, duplicate window %d ms, %d messages per subject, R%d)",
        wanted.stream,
        subjects.ALL.format(prefix=wanted.prefix),
        wanted.duplicate_window_ms,
        wanted.history_size,
        config["num_replicas"],
        extra=log_fields(Action.STREAM_CREATED, stream=wanted.stream),
    )
    if floor is not None and "created" in info:
        skew_ms = floor // FENCE_FLOOR_PER_MS - parse_time_ms(str(info["created"]))
        if abs(skew_ms) > FLOOR_SKEW_WARN_MS:
            logger.warning(
                "stream %s was created with first sequence %d from this host's clock, which is "
                "%+d ms off the server's: fences of a stream of this name created again later "
                "may start below this one's. Synchronise clocks (NTP)",
                wanted.stream,
                floor,
                skew_ms,
                extra=log_fields(Action.STREAM_FLOOR_SKEW, stream=wanted.stream),
            )
    if floor is None or (info.get("config") or {}).get("first_seq") != floor:
        logger.warning(
            "stream %s starts at sequence 1 (the server takes no first sequence: nats-server "
            "2.10+ does), so its fences (claim sequences) start below those of any stream of "
            "that name before it; handlers that guard writes with ctx.fence must reset their "
            "stored fences",
            wanted.stream,
            extra=log_fields(Action.STREAM_FENCE_RESTART, stream=wanted.stream),
        )
    return info, True


def fence_floor() -> int:
    """The first sequence of a new stream: the time in ms x FENCE_FLOOR_PER_MS.

    The local clock is used (the server's is not known before the stream exists); ``_create``
    compares it with the server's creation time and warns when they are far apart.
    """
    return _local_now_ms() * FENCE_FLOOR_PER_MS


def _local_now_ms() -> int:
    return time.time_ns() // NS_PER_MS


def replicas(info: dict[str, Any]) -> int:
    """The replicas of a stream info answer's stream."""
    return int((info.get("config") or {}).get("num_replicas") or 1)


async def align_buckets(api: Api, stream: str, bucket_streams: Sequence[str], want: int) -> None:
    """Give each of ``bucket_streams`` (the ``KV_`` streams of the buckets beside ``stream``)
    that exists ``want`` replicas, the stream's. A bucket that cannot be updated (a user not
    allowed to, a cluster electing) is logged and kept as it is: the stream works without it,
    and the next start tries again."""
    for name in bucket_streams:
        try:
            info = await find(api, name)
            if info is None or replicas(info) == want:
                continue
            config = dict(info.get("config") or {})
            config["num_replicas"] = want
            await api(subjects.API.format(verb="STREAM.UPDATE", stream=name), config)
        except Exception as exc:
            logger.warning(
                "key-value bucket stream %s is kept as it is, not given the %d replicas of stream "
                "%s: %s%s",
                name,
                want,
                stream,
                exc,
                ". With fewer, losing a server that holds it leaves it unreadable (the control "
                "bucket's pauses: claims fail closed)"
                if want > 1
                else "",
                extra=log_fields(Action.BUCKET_UPDATE_FAILED, stream=name),
            )
            continue
        logger.info(
            "updated key-value bucket stream %s: replicas %d -> %d (those of stream %s)",
            name,
            replicas(info),
            want,
            stream,
            extra=log_fields(Action.BUCKET_UPDATED, stream=name),
        )


def max_age_ms(info: dict[str, Any]) -> int:
    """The stream's ``max_age``, in ms, of a stream info answer (0: unlimited)."""
    return int((info.get("config") or {}).get("max_age") or 0) // NS_PER_MS


async def raise_window(api: Api, stream: str, to_ms: int) -> dict[str, Any]:
    """Grow the stream's duplicate window to ``to_ms`` (kept if already longer), and its
    ``max_age`` to ``to_ms`` too if it is shorter: JetStream keeps the window within max_age
    (err_code 10052), and claims kept less than the window are forgotten before it ends."""
    info = await api(subjects.API.format(verb="STREAM.INFO", stream=stream), None)
    if window_ms(info) >= to_ms:
        return info
    config = dict(info.get("config") or {})
    config["duplicate_window"] = to_ms * NS_PER_MS
    if 0 < max_age_ms(info) < to_ms:
        config["max_age"] = to_ms * NS_PER_MS
    return await api(subjects.API.format(verb="STREAM.UPDATE", stream=stream), config)


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
    stream, mine = wanted.stream, subjects.ALL.format(prefix=wanted.prefix)
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
