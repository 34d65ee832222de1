"""OpenTelemetry traces of claims and runs (``pip install anarchon[otel]``).

anarchon uses only ``opentelemetry-api``. Tracing is on as soon as the application sets a
tracer provider (``opentelemetry.trace.set_tracer_provider``, or the ``opentelemetry-instrument``
agent): like any instrumented library, anarchon then sends its spans to that provider, and
sends nothing (at no cost beyond one check per run) while none is set or the API is not
installed. :func:`configure` picks another provider, or turns anarchon's spans off.

Spans (``docs/observability.md`` lists every attribute):

* ``claim <job>`` (kind CLIENT), one per slot an instance claims, on every instance: the
  backend's answer in ``anarchon.outcome`` (``won``, ``lost``, ``skipped``, ``refused``), or
  ``error`` for a slot not claimed because the backend stayed unavailable until it was too late;
* ``run <job>`` (kind INTERNAL), one per attempt, around the handler, which runs inside it: the
  handler's own spans nest under it (plain handlers too: their thread gets the context). The
  result in ``anarchon.outcome`` (on stop without one, the run's fate: ``handed_over``,
  ``handover_failed``, ``left_to_expire``); a failure sets the status to ERROR and records the
  exception, secrets in URLs masked;
* ``slot <job>`` (kind INTERNAL), one per slot nobody runs, fleet-wide: emitted by the one
  instance whose claim wrote the slot's ``skipped`` or ``missed`` record, when it was written
  (``anarchon.outcome`` ``skipped`` or ``missed``, ``anarchon.skip_cause``, ``anarchon.reason``),
  so that with the ``run`` spans every recorded slot has a span.

**One trace per slot.** The trace id is derived from ``(job, slot key)`` (:func:`trace_id`), so
every instance puts its spans about one slot in the same trace without talking to the others:
the claims of all instances, the first attempt and a backup's takeover. Each attempt's span is
the child of a parent derived from ``(job, slot key, attempt)`` (:func:`attempt_parent`), a
remote span no process records; a taken-over attempt's span **links** to the parent of the
attempt it took over (the crashed instance's span id died with it; its parent is the one span
context both can compute). The remote parent is sampled, so a ``ParentBased`` sampler (the
default) records every slot; ``TraceIdRatioBased`` samples whole slots alike on every instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import traceback
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from ._metrics import SLOT_TRIGGERS, refused, unrecorded
from ._models import Run, RunStatus
from ._redact import redact_url
from .backend import ClaimOutcome, ClaimRequest, ClaimStatus
from .logs import slot_iso

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider

    from ._active import ActiveRun

__all__ = ["TRACER_NAME", "attempt_parent", "configure", "enabled", "trace_id"]

#: The instrumentation scope of anarchon's spans.
TRACER_NAME: Final = "anarchon"

_Attributes = dict[str, str | int | bool]
_state: dict[str, Any] = {"provider": None, "enabled": True, "api": None, "cache": None}
# The tracer (or None) looked up once for a batch of runs started together (see pinned), or
# _UNPINNED: looked up per call.
_UNPINNED: Final = object()
_pinned: list[Any] = [_UNPINNED]


class _Attempt:
    """The span of the run whose task this is, and what its handler returned."""

    __slots__ = ("handler", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.handler: str | None = None


# The attempt of the run whose task this is (None elsewhere), for handler_done().
_ATTEMPT: ContextVar[_Attempt | None] = ContextVar("anarchon_attempt", default=None)


def configure(tracer_provider: TracerProvider | None = None, *, enabled: bool = True) -> None:
    """Send anarchon's spans to ``tracer_provider`` (default: the global one, as set by
    ``opentelemetry.trace.set_tracer_provider``), or, with ``enabled=False``, send none.

    Raises :class:`~anarchon.errors.MissingDependency` when a provider is given but
    ``opentelemetry-api`` is not installed."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled={enabled!r} must be True or False")
    if tracer_provider is not None:
        api = _api()
        if api is None:
            from .errors import MissingDependency

            raise MissingDependency(
                "a tracer provider needs opentelemetry-api: pip install 'anarchon[otel]'"
            )
        if not callable(getattr(tracer_provider, "get_tracer", None)):
            raise TypeError(
                f"tracer_provider={tracer_provider!r} is not an OpenTelemetry TracerProvider "
                "(it has no get_tracer())"
            )
    _state.update(provider=tracer_provider, enabled=enabled, cache=None)


def enabled() -> bool:
    """True when anarchon's spans go somewhere now: ``opentelemetry-api`` is installed, a
    tracer provider is set (or given to :func:`configure`) and tracing is not turned off."""
    return _tracer() is not None


def trace_id(job: str, slot_key: str) -> int:
    """The trace id of every span about ``(job, slot_key)`` on every instance: 128 bits of
    SHA-256 (``format(trace_id(...), "032x")`` is the id a tracing UI searches for). A
    scheduled slot's key is its epoch milliseconds as a string (``"1767225600000"``)."""
    digest = hashlib.sha256(f"anarchon\0{job}\0{slot_key}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def attempt_parent(job: str, slot_key: str, attempt: int) -> SpanContext:
    """The remote span context every instance derives for attempt ``attempt`` of
    ``(job, slot_key)``: the parent of that attempt's ``run`` span, and what its successor's
    span links to. Needs ``opentelemetry-api``."""
    api = _api()
    if api is None:
        from .errors import MissingDependency

        raise MissingDependency("attempt_parent() needs opentelemetry-api: anarchon[otel]")
    digest = hashlib.sha256(f"anarchon\0{job}\0{slot_key}\0{attempt}".encode()).digest()
    return api.SpanContext(  # type: ignore[no-any-return]
        trace_id=trace_id(job, slot_key),
        span_id=int.from_bytes(digest[:8], "big") or 1,
        is_remote=True,
        trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED),
    )


# -- the core's hooks ---------------------------------------------------------------------------


def traced_run(
    active: ActiveRun, run: Coroutine[Any, Any, Run | None]
) -> Coroutine[Any, Any, Run | None]:
    """The run's coroutine (``run``, which returns the recorded run), inside the attempt's
    span when tracing is on."""
    tracer = _tracer()
    if tracer is None:
        return run
    return _traced_run(tracer, active, run)


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """Within, the tracer is looked up once, not once per run: a claim's answers start
    thousands of runs in one step of the event loop (no await inside), and finding that no
    tracer provider is set costs a look into the environment each time."""
    before = _pinned[0]
    _pinned[0] = _tracer()
    try:
        yield
    finally:
        _pinned[0] = before


def handler_done(outcome: tuple[RunStatus, str | None, BaseException | None] | None) -> None:
    """The handler of the current run returned (``outcome``: status, error, exception; None if
    it was cancelled): record its exception on the attempt's span, secrets masked."""
    attempt = _ATTEMPT.get()
    if attempt is None or outcome is None:
        return
    status, error, exc = outcome
    span = attempt.span
    attempt.handler = status.value
    span.set_attribute("anarchon.handler", status.value)
    if exc is not None:
        _record_exception(span, exc)
    elif error:
        span.add_event("handler failed", {"anarchon.error": redact_url(error)})


def preload() -> None:
    """Import the OpenTelemetry API now, if tracing is on and it is installed (the scheduler
    calls this in a thread as it starts): imported on the first claim instead, it held that
    claim's event loop for its import and its context's entry-point look-up (3.7 s once, on
    a loaded machine)."""
    if _state["enabled"]:
        _api()


def claimed(
    requests: Sequence[ClaimRequest],
    answers: Sequence[ClaimOutcome | Exception],
    sent: int,
    backend: str,
    now_ms: int,
) -> None:
    """Claims were answered (each request's outcome or error, in order; ``sent`` and
    ``now_ms`` on the scheduler's monotonic clock): one ``claim`` span per request."""
    tracer = _tracer()
    if tracer is None or not answers:
        return
    api = _api()
    end = time.time_ns()
    for request, outcome in zip(requests, answers, strict=True):
        attributes: _Attributes = {
            **_slot_attributes(request.job, request.slot, request.slot_key),
            "anarchon.instance": request.instance,
            "anarchon.trigger": request.trigger.value,
            "anarchon.backend": backend,
        }
        status = None
        if isinstance(outcome, ClaimOutcome):
            name = outcome.status.value
            if outcome.status is ClaimStatus.LOST and refused(outcome):
                # Refused, nothing recorded: nobody runs the slot (no other instance won it).
                name = "refused"
                status = str(outcome.error) if outcome.error is not None else outcome.run.reason
            attributes["anarchon.outcome"] = name
            attributes["anarchon.holder"] = outcome.run.instance
            attributes["anarchon.run_id"] = outcome.run.run_id
            if outcome.run.reason:
                attributes["anarchon.reason"] = outcome.run.reason
        else:  # not claimed: the backend stayed unavailable until the slot was too late
            attributes["anarchon.outcome"] = "error"
            status = f"{type(outcome).__name__}: {outcome}"
        start = end - max(0, now_ms - sent) * 1_000_000
        span = _beside_claims(tracer, api, "claim", request, api.SpanKind.CLIENT, attributes, start)
        if status is not None:
            span.set_status(api.Status(api.StatusCode.ERROR, redact_url(status)))
        span.end(end_time=end)
        if isinstance(outcome, ClaimOutcome) and recorded_not_run(request, outcome):
            _not_run_span(tracer, api, request, outcome.run, backend, end)


def missed(
    requests: Sequence[ClaimRequest], answers: Sequence[ClaimOutcome | Exception], backend: str
) -> None:
    """Missed slots were claimed (:mod:`anarchon._missed`): one ``slot`` span, outcome
    ``missed``, per slot whose record this instance's claim wrote."""
    tracer = _tracer()
    if tracer is None:
        return
    api = _api()
    end = time.time_ns()
    for request, outcome in zip(requests, answers, strict=True):
        if isinstance(outcome, ClaimOutcome) and recorded_not_run(request, outcome):
            _not_run_span(tracer, api, request, outcome.run, backend, end)


def recorded_not_run(request: ClaimRequest, outcome: ClaimOutcome) -> bool:
    """``request``'s claim wrote the record of a slot nobody runs (``skipped`` or ``missed``):
    the backend answered SKIPPED with this request's own run, and stored it. Exactly one claim
    writes a slot's record, so on exactly one instance of the fleet; a scheduled or caught-up
    slot only (a run request is no slot)."""
    return (
        outcome.status is ClaimStatus.SKIPPED
        and outcome.run.run_id == request.run_id
        and request.trigger in SLOT_TRIGGERS
        and not unrecorded(outcome)
    )


# -- inside -------------------------------------------------------------------------------------


def _api() -> Any:
    """``opentelemetry.trace``, imported on first use; None when it is not installed."""
    api = _state["api"]
    if api is None:
        try:
            from opentelemetry import trace
        except ImportError:
            api = False
        else:
            api = trace
        _state["api"] = api
    return api or None


def _tracer() -> Tracer | None:
    tracer = _pinned[0]
    if tracer is not _UNPINNED:
        return tracer  # type: ignore[no-any-return]
    if not _state["enabled"]:
        return None
    api = _api()
    if api is None:
        return None
    provider = _state["provider"] or api.get_tracer_provider()
    if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
        return None  # nothing set: the API's tracers would make spans nobody records
    cache = _state["cache"]
    if cache is None or cache[0] is not provider:
        from . import __version__

        cache = _state["cache"] = (provider, provider.get_tracer(TRACER_NAME, __version__))
    return cache[1]  # type: ignore[no-any-return]


def _slot_attributes(job: str, slot: int | None, slot_key: str) -> _Attributes:
    attributes: _Attributes = {"anarchon.job": job, "anarchon.slot_key": slot_key}
    if slot is not None:  # None (a manual run) is no attribute value
        attributes["anarchon.slot"] = slot
        attributes["anarchon.slot_iso"] = slot_iso(slot) or ""
    return attributes


def _not_run_span(
    tracer: Tracer, api: Any, request: ClaimRequest, run: Run, backend: str, end: int
) -> None:
    """The ``slot <job>`` span of a slot nobody runs, at the moment its record was written: in
    the slot's trace, beside its claims (the same parent as their spans)."""
    attributes: _Attributes = {
        **_slot_attributes(request.job, request.slot, request.slot_key),
        "anarchon.instance": request.instance,
        "anarchon.trigger": request.trigger.value,
        "anarchon.backend": backend,
        "anarchon.outcome": run.status.value,
        "anarchon.run_id": run.run_id,
    }
    if run.skip_cause is not None:
        attributes["anarchon.skip_cause"] = run.skip_cause.value
    if run.reason:
        attributes["anarchon.reason"] = redact_url(run.reason)
    _beside_claims(tracer, api, "slot", request, api.SpanKind.INTERNAL, attributes, end).end(
        end_time=end
    )


def _beside_claims(
    tracer: Tracer,
    api: Any,
    verb: str,
    request: ClaimRequest,
    kind: Any,
    attributes: _Attributes,
    start: int,
) -> Span:
    """A span ``<verb> <job>`` started at ``start`` (ns) under the parent of the slot's first
    attempt, the one every instance's claim of it has."""
    parent = attempt_parent(request.job, request.slot_key, 1)
    return tracer.start_span(
        f"{verb} {request.job}",
        context=api.set_span_in_context(api.NonRecordingSpan(parent)),
        kind=kind,
        attributes=attributes,
        start_time=start,
    )


def _attempt_attributes(active: ActiveRun) -> Mapping[str, str | int | bool]:
    ticket = active.ticket
    attributes = {
        **_slot_attributes(ticket.job, ticket.slot, ticket.slot_key),
        "anarchon.run_id": ticket.run_id,
        "anarchon.attempt": ticket.attempt,
        "anarchon.trigger": ticket.trigger.value,
        "anarchon.instance": ticket.instance,
        "anarchon.retry": active.ctx.retry,
    }
    if ticket.fence is not None:
        attributes["anarchon.fence"] = ticket.fence
    return attributes


async def _traced_run(
    tracer: Tracer, active: ActiveRun, run: Coroutine[Any, Any, Run | None]
) -> Run | None:
    api = _api()
    ticket = active.ticket
    links = []
    if ticket.attempt > 1:  # a takeover: link to the attempt it took over
        before = attempt_parent(ticket.job, ticket.slot_key, ticket.attempt - 1)
        links.append(
            api.Link(before, {"anarchon.link": "took_over", "anarchon.attempt": ticket.attempt - 1})
        )
    parent = attempt_parent(ticket.job, ticket.slot_key, ticket.attempt)
    span = tracer.start_span(
        f"run {ticket.job}",
        context=api.set_span_in_context(api.NonRecordingSpan(parent)),
        kind=api.SpanKind.INTERNAL,
        attributes=_attempt_attributes(active),
        links=links,
    )
    attempt = _Attempt(span)
    token = _ATTEMPT.set(attempt)
    try:
        with api.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            recorded = await run
    except asyncio.CancelledError:
        span.set_attribute("anarchon.outcome", "cancelled")
        raise
    except BaseException as exc:
        span.set_attribute("anarchon.outcome", "error")
        _record_exception(span, exc)
        span.set_status(
            api.Status(api.StatusCode.ERROR, redact_url(f"{type(exc).__name__}: {exc}"))
        )
        raise
    else:
        _set_outcome(api, attempt, active, recorded)
        return recorded
    finally:
        _ATTEMPT.reset(token)
        span.end()


def _record_exception(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` as an ``exception`` event, its message and stack trace with
    their secrets masked (:func:`~anarchon._redact.redact_url`), as in the logs."""
    stacktrace = "".join(traceback.format_exception(exc))
    span.record_exception(
        exc,
        attributes={
            "exception.message": redact_url(str(exc)),
            "exception.stacktrace": redact_url(stacktrace),
        },
    )


def _set_outcome(api: Any, attempt: _Attempt, active: ActiveRun, recorded: Run | None) -> None:
    span = attempt.span
    if recorded is not None:
        span.set_attribute("anarchon.outcome", recorded.status.value)
        if recorded.status is RunStatus.FAILED:
            span.set_status(api.Status(api.StatusCode.ERROR, recorded.error or "failed"))
        return
    if active.fate is not None:
        outcome = active.fate  # on stop: handed_over, handover_failed, left_to_expire
    elif active.ctx.lease_lost:
        outcome = "lease_lost"
    elif attempt.handler is None:
        outcome = "not_started"  # its lease ran out before the handler could start
    else:
        outcome = "not_recorded"  # the result was refused or could not be recorded
    span.set_attribute("anarchon.outcome", outcome)
