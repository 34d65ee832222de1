"""What the NATS backend stores in a message, and how stored messages become runs (and the
claim notices it sends on core NATS).

A claim's payload carries the claim request (job, slot, slot key, run id, token, instance,
trigger, and ``requested_by`` when set; plus ``status``, ``skipped`` or ``missed``, ``reason``
and, when it has one, ``skip_cause`` (an :class:`~anarchon.SkipCause` value) for a skip record;
a skip record stored without ``skip_cause`` reads its cause from its reason's words,
:func:`~anarchon.kit.lease.skip_cause_of`). A result's payload repeats the run's identity, fence
and start, so a result whose claim was already trimmed still shows in history. Times are never in
payloads: a run starts at its claim's stream timestamp and ends at its result's, both stamped by
the stream leader (the backend's clock).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, Final

from ...backend import ClaimNotice, ClaimRequest, RunIdentity, SkipCause, Ticket
from ...kit import Run, RunStatus, Trigger, maker, ms_to_datetime
from ...kit.feed import encode_notice
from ...kit.lease import SKIP_STATUSES, skip_cause_of, ticket_of
from . import _subjects as subjects

VERSION: Final = 1
_scan: Final[Callable[[str, int], tuple[Any, int]]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
#: Claim notices per core NATS message (far under the default 1 MB payload limit).
NOTICES_PER_MESSAGE: Final = 500
#: The fields that name a run, the same in a claim request, a claim, a ticket and both payloads.
IDENTITY: Final = tuple(f.name for f in fields(RunIdentity))


def identity(source: object) -> dict[str, Any]:
    """The :data:`IDENTITY` fields of ``source``, to build another record of the same run."""
    return {name: getattr(source, name) for name in IDENTITY}


def run_of(
    source: RunIdentity | ClaimRequest,
    status: RunStatus,
    started_ms: int,
    finished_ms: int | None = None,
    *,
    fence: int | None = None,
    error: str | None = None,
    reason: str | None = None,
    requested_by: str | None = None,
    skip_cause: SkipCause | None = None,
) -> Run:
    """The run ``source`` names, with this status and these stream (or local) times."""
    return _new_run(
        job=source.job,
        slot=ms_to_datetime(source.slot),
        run_id=source.run_id,
        instance=source.instance,
        trigger=source.trigger,
        attempt=1,
        status=status,
        started_at=_datetime(started_ms),
        finished_at=None if finished_ms is None else _datetime(finished_ms),
        error=error,
        fence=fence,
        reason=reason,
        skip_cause=skip_cause,
        requested_by=requested_by,
    )


def unrecorded(req: ClaimRequest, at_ms: int, reason: str, skip_cause: SkipCause | None) -> Run:
    """A skipped run that only an answer carries: nothing of it is stored. ``skip_cause``:
    :attr:`~anarchon.SkipCause.NOT_RECORDED` for a skip the answer reports but nothing stored,
    None for a lost claim whose winner cannot be shown."""
    return run_of(
        req,
        RunStatus.SKIPPED,
        at_ms,
        at_ms,
        reason=reason,
        requested_by=req.requested_by,
        skip_cause=skip_cause,
    )


def heard_run(req: ClaimRequest, holder: str, at_ms: int) -> Run:
    """The run another instance announced winning ``req``'s slot with (a claim notice): the
    slot's, ``running`` on ``holder``. The notice names no run id, so the run has none."""
    return _new_run(
        job=req.job,
        slot=ms_to_datetime(req.slot),
        run_id="",
        instance=holder,
        trigger=req.trigger,
        attempt=1,
        status=RunStatus.RUNNING,
        started_at=_datetime(at_ms),
        finished_at=None,
        error=None,
        fence=None,
        reason=None,
        requested_by=None,
    )


@dataclass(frozen=True, slots=True)
class Stored:
    """One message as JetStream keeps it."""

    seq: int
    subject: str
    time_ms: int
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim(RunIdentity):
    """A claim message, decoded."""

    seq: int
    time_ms: int
    reason: str | None = None
    """Set for a skip record."""
    status: RunStatus = RunStatus.SKIPPED
    """A skip record's status: ``skipped`` or ``missed``."""
    requested_by: str | None = None
    skip_cause: SkipCause | None = None
    """A skip record's cause, stored or read from its reason (:func:`decode_claim`)."""

    @property
    def skipped(self) -> bool:
        """True for a skip record (the slot recorded ``skipped`` or ``missed``: too late,
        paused, or nobody ran it)."""
        return self.reason is not None

    def run(self) -> Run:
        """The run this claim started (``running``; a skip record is ``skipped`` or
        ``missed``)."""
        if self.skipped:
            return run_of(
                self,
                self.status,
                self.time_ms,
                self.time_ms,
                reason=self.reason,
                requested_by=self.requested_by,
                skip_cause=self.skip_cause,
            )
        return run_of(self, _RUNNING, self.time_ms, fence=self.seq, requested_by=self.requested_by)

    def ticket(self) -> Ticket:
        """The winner's ticket: the fence is the claim's stream sequence."""
        return ticket_of(
            self, attempt=1, fence=self.seq, started_at_ms=self.time_ms, backend_now_ms=self.time_ms
        )


# Stored text to member by one dict lookup (the enum's own call costs eight times as much), and
# the member a claim reads as a constant (on Python 3.11 ``RunStatus.SKIPPED`` goes through
# EnumType's ``__getattr__``): a lost claim decodes the winner's claim.
_TRIGGERS: Final = {trigger.value: trigger for trigger in Trigger}
_SKIPPED: Final = RunStatus.SKIPPED
_RUNNING: Final = RunStatus.RUNNING
# Every claim's answer builds a Run, and a lost one a Stored and a Claim too: built by makers
# (see anarchon._frozen), about three times as fast as the classes' own __init__.
_new_run: Final = maker(Run)
new_stored: Final = maker(Stored)
"""``Stored(seq, subject, time_ms, data)``, built as fast (the claims feed makes one a claim)."""
_new_claim: Final = maker(Claim)


def encode_claim(req: ClaimRequest, slot_key: str | None = None) -> bytes:
    """The payload of a claim message: the JSON of ``{"v": VERSION, **identity(req)}``, then
    ``requested_by`` when set, and a skip record's ``status``, ``reason`` and ``skip_cause``
    (``slot_key``: ``req.slot_key``, when the caller has it)."""
    # Written out rather than encoded as a dict (the same bytes as _dump's): every claim
    # sends one, and json.dumps of a dict costs three times as much.
    slot = "null" if req.slot is None else f"{req.slot:d}"
    out = (
        f'{{"v":{VERSION},"job":{_quote(req.job)},"slot":{slot},'
        f'"slot_key":{_quote(req.slot_key if slot_key is None else slot_key)},'
        f'"run_id":{_quote(req.run_id)},'
        f'"token":{_quote(req.token)},"instance":{_quote(req.instance)},'
        f'"trigger":{_quote(req.trigger)}'
    )
    if req.requested_by is not None:
        out += f',"requested_by":{_quote(req.requested_by)}'
    if req.skip_reason is not None:
        out += f',"status":{_quote(str(req.skip_status))},"reason":{_quote(req.skip_reason)}'
        if req.skip_cause is not None:
            out += f',"skip_cause":{_quote(req.skip_cause)}'
    return (out + "}").encode()


def decode_claim(msg: Stored) -> Claim | None:
    """The claim in ``msg``, or None if it is not one of anarchon's."""
    body = _load(msg.data)
    try:
        status = body.get("status")
        skip = status in SKIP_STATUSES
        requested_by = body.get("requested_by")
        reason = str(body["reason"]) if skip else None
        cause = body.get("skip_cause") if skip else None
        return _new_claim(
            **_identity_of(body),
            seq=msg.seq,
            time_ms=msg.time_ms,
            reason=reason,
            status=RunStatus(str(status)) if skip else _SKIPPED,
            requested_by=None if requested_by is None else str(requested_by),
            skip_cause=skip_cause_of(None if cause is None else str(cause), reason),
        )
    except (KeyError, TypeError, ValueError):
        return None


def slot_of(claim: Claim) -> int | None:
    """The slot of a scheduled or catch-up slot's claim (or skip record); None for a manual
    run's or a retry's."""
    if claim.trigger not in (Trigger.SCHEDULE, Trigger.CATCH_UP):
        return None
    return claim.slot if claim.slot_key == str(claim.slot) else None


def claim_of_request(req: ClaimRequest, seq: int, time_ms: int) -> Claim:
    """The claim a request would store, for answers built without reading it back."""
    return Claim(
        **identity(req),
        seq=seq,
        time_ms=time_ms,
        reason=req.skip_reason,
        status=req.skip_status,
        requested_by=req.requested_by,
        skip_cause=skip_cause_of(req.skip_cause, req.skip_reason),
    )


def notices_message(notices: Sequence[ClaimNotice]) -> str:
    """Several claim notices as one message: a JSON list of them (:func:`encode_notice`)."""
    return f"[{','.join(encode_notice(n) for n in notices)}]"


def encode_result(
    ticket: Ticket, status: RunStatus, error: str | None, reason: str | None = None
) -> bytes:
    """The payload of a result message (``reason`` for a claim closed without running)."""
    body: dict[str, Any] = {
        "v": VERSION,
        **identity(ticket),
        "fence": ticket.fence,
        "started_at": ticket.started_at_ms,
        "status": str(status),
        "error": error,
    }
    if reason is not None:
        body["reason"] = reason
    return _dump(body)


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """A result message, decoded."""

    run: Run
    """The finished run, complete even without its claim."""
    token: str
    seq: int


def decode_result(msg: Stored) -> Result | None:
    """The result in ``msg``, or None if it is not one of anarchon's."""
    body = _load(msg.data)
    try:
        named = Claim(**_identity_of(body), seq=0, time_ms=0)
        fence = body.get("fence")
        run = run_of(
            named,
            RunStatus(body["status"]),
            int(body["started_at"]),
            msg.time_ms,
            fence=None if fence is None else int(fence),
            error=None if body.get("error") is None else str(body["error"]),
            reason=None if body.get("reason") is None else str(body["reason"]),
        )
        return Result(run=run, token=named.token, seq=msg.seq)
    except (KeyError, TypeError, ValueError):
        return None


def finished(claim_run: Run, result: Run) -> Run:
    """The claim's run with the result's end."""
    return replace(
        claim_run,
        status=result.status,
        finished_at=result.finished_at,
        error=result.error,
        reason=result.reason,
    )


def merge(messages: Iterable[Stored], prefix: str, job: str) -> list[Run]:
    """Combine a job's claims and results into runs, newest first (by start, then fence).

    A claim without a result stays ``running``. A skip record stored for a slot that already has
    a claim (possible only once the de-duplication window has passed) is left out; two real
    claims for one slot are both shown, since both ran.
    """
    claims_subject = subjects.CLAIMS.format(prefix=prefix, job=job)
    results_subject = subjects.RESULTS.format(prefix=prefix, job=job)
    runs: dict[str, tuple[int, Run]] = {}
    slots: set[str] = set()
    for msg in sorted(messages, key=lambda m: m.seq):
        if msg.subject == claims_subject:
            claim = decode_claim(msg)
            if claim is None or (claim.skipped and claim.slot_key in slots):
                continue
            slots.add(claim.slot_key)
            runs[claim.run_id] = (claim.seq, claim.run())
        elif msg.subject == results_subject:
            result = decode_result(msg)
            if result is None:
                continue
            known = runs.get(result.run.run_id)
            if known is None:
                runs[result.run.run_id] = (result.run.fence or 0, result.run)
            else:
                runs[result.run.run_id] = (known[0], finished(known[1], result.run))
    ordered = sorted(runs.values(), key=lambda item: (item[1].started_at, item[0]), reverse=True)
    return [run for _, run in ordered]


def _identity_of(body: dict[str, Any]) -> dict[str, Any]:
    """The :data:`IDENTITY` fields of a payload, typed (KeyError, TypeError or ValueError if it
    is not one of anarchon's)."""
    slot = body["slot"]
    return {
        "job": str(body["job"]),
        "slot": None if slot is None else int(slot),
        "slot_key": str(body["slot_key"]),
        "run_id": str(body["run_id"]),
        "token": str(body["token"]),
        "instance": str(body["instance"]),
        "trigger": _TRIGGERS.get(body["trigger"]) or Trigger(body["trigger"]),
    }


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def load_json(data: bytes) -> Any:
    """The JSON value of ``data`` (UTF-8), as ``json.loads`` reads it: ValueError if it is not
    JSON. The value is read by the JSON scanner itself (``json.loads`` adds the detection of
    the encoding, two regular-expression matches and three calls around it: most of its cost on
    an ack or a claim); anything the scanner cannot take whole goes through ``json.loads``."""
    text = data.decode()
    try:
        value, end = _scan(text, 0)
        if end == len(text):
            return value
    except (StopIteration, ValueError):
        pass
    return json.loads(text)


def _load(data: bytes) -> dict[str, Any]:
    try:
        body = load_json(data)
    except ValueError:  # UnicodeDecodeError included
        return {}
    return body if isinstance(body, dict) else {}


def _datetime(ms: int) -> datetime:
    moment = ms_to_datetime(ms)
    assert moment is not None
    return moment


def parse_time_ms(text: str) -> int:
    """Epoch ms of a JetStream timestamp such as ``2026-12-02T17:51:45.174528297Z``.

    Parsed by hand to keep the nanoseconds' millisecond exact (floor), the same value a
    consumer's ack subject gives for the message.
    """
    body, _, rest = text.partition(".")
    digits = ""
    zone = ""
    if rest:
        end = len(rest) - len(rest.lstrip("0123456789"))
        digits, zone = rest[:end], rest[end:]
    else:
        for mark in ("Z", "+", "-"):
            cut = body.rfind(mark)
            if cut > 10:  # past the date's own dashes
                body, zone = body[:cut], body[cut:]
                break
    zone = "+00:00" if zone in ("Z", "z", "") else zone
    seconds = int(datetime.fromisoformat(body + zone).timestamp())
    return seconds * 1000 + int((digits + "000")[:3])


def ack_fields(reply: str | bytes) -> tuple[int, int, int] | None:
    """``(stream sequence, timestamp ms, messages left)`` from a consumer message's ack
    subject (text, or the bytes nats-py's parser reads: the claims feed's are never decoded),
    or None.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts-ns>.<pending>`` (9 tokens), or
    with domain and account hash (``$JS.ACK.<domain>.<hash>.<stream>...``, 11 or 12 tokens).
    """
    raw = reply.encode() if isinstance(reply, str) else reply
    if not raw.startswith(b"$JS.ACK."):
        return None
    tokens = raw.split(b".")
    try:
        if len(tokens) == 9:
            return int(tokens[5]), int(tokens[7]) // 1_000_000, int(tokens[8])
        if len(tokens) >= 11:
            return int(tokens[7]), int(tokens[9]) // 1_000_000, int(tokens[10])
    except ValueError:
        return None
    return None
