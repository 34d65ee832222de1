"""The dashboard's Starlette application: pages, the explanation panel and the actions."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import steering
from .._job import check_name
from .._models import Trigger
from .._options import HISTORY_LIMIT
from .._readable import iso_exact, ms_of
from .._redact import redact_url
from .._scheduler import Scheduler
from .._times import EARLIEST_MS, check_readable, no_carrier, parse_time, parse_time_ms
from ..backend import Backend
from ..control import ALL_JOBS, RunRequest
from ..errors import AnarchonError, BackendError, ConfigurationError, JobNotFound
from ..registry import SILENT_HEARTBEATS, carrier_warning, trigger_refusal
from . import _data
from ._auth import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    Guard,
    SignInLimit,
    TokenCheck,
    clean_name,
    csrf_ok,
    new_csrf,
)
from ._explain import explain, unknown_job

__all__ = ["build_app"]

logger = logging.getLogger("anarchon.web")
HERE: Final = Path(__file__).resolve().parent
PARTIAL_HEADER: Final = "x-anarchon-partial"
#: Timeline ranges offered, by name: span in ms.
RANGES: Final = {
    "1h": 3_600_000,
    "6h": 6 * 3_600_000,
    "24h": 86_400_000,
    "7d": 7 * 86_400_000,
    "30d": 30 * 86_400_000,
    "365d": 365 * 86_400_000,
}
#: "Pause for" choices on the forms, in minutes (0: until resumed).
PAUSE_FOR: Final = (0, 15, 60, 240, 1440)
HISTORY_ROWS: Final = 200
#: The history filters a job page takes, with the values each allows (``instance`` takes any).
FILTERS: Final = {
    "status": ("succeeded", "failed", "running", "skipped", "missed", "paused", "late"),
    "trigger": tuple(t.value for t in Trigger),
}
JOBS_PER_PAGE: Final = 50


class Source:
    """The backend the dashboard reads: a scheduler's (started by it), or one of its own,
    started on the first request with ``start_reader`` and stopped by :meth:`close`."""

    def __init__(self, target: Scheduler | Backend) -> None:
        if isinstance(target, Scheduler):
            self.scheduler: Scheduler | None = target
            self.backend = target.backend
        elif isinstance(target, Backend):
            self.scheduler = None
            self.backend = target
        else:
            raise TypeError(f"dashboard({target!r}): pass an anarchon Scheduler or Backend")
        self._started = False
        self._lock = asyncio.Lock()

    @property
    def label(self) -> str:
        """The backend, as pages name it (no secret)."""
        return redact_url(repr(self.backend))

    async def get(self) -> Backend:
        """The started backend."""
        if self.scheduler is not None:
            if not self.scheduler.running:
                raise AnarchonError("the scheduler is not running: start it before the dashboard")
            return self.backend
        async with self._lock:
            if not self._started:
                await self.backend.start_reader()
                self._started = True
        return self.backend

    async def close(self) -> None:
        """Stop the backend if the dashboard started it."""
        async with self._lock:
            if self._started:
                self._started = False
                await self.backend.stop()


def _iso(ms: int | None) -> str:
    """A time as the pages show it: UTC with its ``Z``, and its milliseconds when it has some
    (as ``anarchon explain`` and ``history`` print it), so a time copied from a page into a
    slot address, ``explain`` or ``pause --until`` names the same instant; ``-`` for None."""
    return "-" if ms is None else iso_exact(ms)


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        iso=_iso,
        span=_data.span,
        redact=redact_url,
        q=lambda s: quote(str(s), safe=""),
        words=_data.schedule_in_words,
        fate=_data.fate_of,
        ms=lambda d: None if d is None else ms_of(d),
        lastline=lambda s: (s or "").strip().splitlines()[-1] if (s or "").strip() else "",
    )
    env.globals.update(
        FATES=_data.FATES,
        RANGES=RANGES,
        FILTERS=FILTERS,
        PAUSE_FOR=PAUSE_FOR,
        SILENT_HEARTBEATS=SILENT_HEARTBEATS,
    )
    return env


def _int(value: str | None, name: str, low: int, high: int, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise _BadRequest(f"{name}={value!r} must be a whole number from {low} to {high}")
    return number


def _time(value: str | None, name: str, default: int, job: str, zone: str | None) -> int:
    """A time parameter about ``job``: epoch ms or ISO 8601 (without an offset: in the job's
    ``zone``, as on the command line) within the times anarchon handles (InvalidOption, so
    400, naming it and the rule otherwise)."""
    if value is None or value == "":
        return default
    return parse_time_ms(value, zone, what=name, no_zone=no_carrier(job))


class _BadRequest(Exception):
    pass


class Dashboard:
    """The application's state and its request handlers."""

    def __init__(
        self,
        target: Scheduler | Backend,
        token: str | TokenCheck | None,
        *,
        title: str,
        refresh_ms: int,
        registry_ttl_ms: int,
    ) -> None:
        self.source = Source(target)
        self.guard = Guard(token)
        self.sign_ins = SignInLimit()
        self.title = title
        if not 0 <= refresh_ms <= 3_600_000:
            raise ValueError(f"refresh_ms={refresh_ms!r} must be from 0 (off) to 3600000")
        self.refresh_ms = refresh_ms
        if not 0 <= registry_ttl_ms <= 60_000:
            raise ValueError(f"registry_ttl_ms={registry_ttl_ms!r} must be from 0 to 60000")
        self.views = _data.ViewCache(registry_ttl_ms)
        self.env = _templates()

    # -- helpers ----------------------------------------------------------------------------

    def _base(self, request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def _render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        started = time.perf_counter()
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf()
        operator = await self.guard.operator(request)
        partial = request.headers.get(PARTIAL_HEADER) == "1"
        base = self._base(request)
        flash, warn = self.guard.open_message(
            request.cookies.get(CSRF_COOKIE), request.query_params.get(MESSAGE)
        )
        html = self.env.get_template(template).render(
            request=request,
            base=base,
            title=self.title,
            backend_label=self.source.label,
            operator=operator,
            writable=self.guard.writable,
            login_form=self.guard.login_form,
            csrf=csrf,
            partial=partial,
            refresh_ms=self.refresh_ms,
            flash=flash,
            warn=warn,
            here=_without_messages(request.url.path, request.url.query),
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        response.headers["cache-control"] = "no-store"
        response.headers["x-frame-options"] = "DENY"
        response.headers["content-security-policy"] = (
            "default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'"
        )
        response.headers["server-timing"] = (
            f"render;dur={(time.perf_counter() - started) * 1e3:.1f}"
        )
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(
                CSRF_COOKIE, csrf, httponly=True, samesite="strict", path=base + "/"
            )
        return response

    async def _failure(self, request: Request, exc: Exception, status: int) -> Response:
        return await self._error(request, status, redact_url(f"{type(exc).__name__}: {exc}"))

    async def _error(self, request: Request, status: int, message: str) -> Response:
        """An error reply: ``{"ok": false, "error": message}`` for a JSON client
        (:func:`_wants_json`), else the error page."""
        if _wants_json(request):
            return _json_error(status, message)
        return await self._render(request, "error.html", status=status, message=message)

    # -- pages ------------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        """The jobs page: every job with its next slot, last run, pause and strip."""
        started = time.perf_counter()
        params = request.query_params
        query = params.get("q", "")[:200]
        per = _int(params.get("per"), "per", 10, 500, JOBS_PER_PAGE)
        backend = await self.source.get()
        snapshot = await _data.read_snapshot(backend, self.views)
        names = _data.select_jobs(snapshot, query)
        pages = max(1, math.ceil(len(names) / per))
        page = min(_int(params.get("page"), "page", 1, 1_000_000, 1), pages)
        shown = names[(page - 1) * per : page * per]
        rows = await _data.job_rows(backend, snapshot, shown)
        if _wants_json(request):
            return JSONResponse(
                {
                    "now_ms": snapshot.now_ms,
                    "total": len(names),
                    "page": page,
                    "pages": pages,
                    "jobs": [_row_dict(r) for r in rows],
                }
            )
        response = await self._render(
            request,
            "jobs.html",
            snapshot=snapshot,
            rows=rows,
            total=len(names),
            all_jobs=len(snapshot.view.definitions),
            page=page,
            pages=pages,
            per=per,
            query=query,
            page_link=lambda n: "?" + urlencode({"q": query, "page": n, "per": per}),
        )
        _timing(response, started)
        return response

    async def job(self, request: Request) -> Response:
        """One job: its timeline over a range, the explanation panel, its history."""
        started = time.perf_counter()
        name = request.path_params["name"]
        check_name(name)
        params = request.query_params
        backend = await self.source.get()
        snapshot = await _data.read_snapshot(backend, self.views)
        definitions = snapshot.view.definitions.get(name)
        limit = _int(params.get("runs"), "runs", 100, HISTORY_LIMIT.high, 10_000)
        runs = await backend.history(name, limit)
        if not definitions and not runs:
            raise unknown_job(name)
        range_name = params.get("range", "")
        if range_name and range_name not in RANGES:
            raise _BadRequest(f"range={range_name!r} must be one of {', '.join(RANGES)}")
        now = snapshot.now_ms
        zone = definitions[0].zone if definitions else None
        if params.get("from") or params.get("to"):
            end = _time(params.get("to"), "to", now, name, zone)
            start = _time(
                params.get("from"), "from", max(EARLIEST_MS, end - RANGES["24h"]), name, zone
            )
            if start >= end:
                raise _BadRequest(f"from ({start}) must be before to ({end})")
        else:
            span = RANGES[range_name or "24h"]
            end = _time(params.get("end"), "end", now, name, zone)
            start = end - span
            if start < EARLIEST_MS:
                raise _BadRequest(
                    f"end={params.get('end')!r} must be at least {span}: the range starts "
                    "1970-01-01 or later"
                )
        definition = definitions[0] if definitions else None
        line = None
        if definition is not None:
            line = _data.timeline(definition, runs, start, end, now, complete=len(runs) < limit)
        for key, allowed in FILTERS.items():
            given = params.get(key, "")
            if given and given not in allowed:
                raise _BadRequest(f"{key}={given!r} must be one of {', '.join(allowed)}")
        table = _filter(runs, params)[:HISTORY_ROWS]
        row = (await _data.job_rows(backend, snapshot, [name]))[0] if definitions else None
        pending = await steering.pending_requests(backend, name) if snapshot.has_control else []
        refusal = None
        if snapshot.has_control and not snapshot.view.carriers(name):
            refusal = await _refusal(backend, name)  # its page offers "Trigger anyway"
        if _wants_json(request):
            return JSONResponse(
                {
                    "now_ms": now,
                    "job": name,
                    "definition": None if definition is None else definition.to_dict(),
                    "row": None if row is None else _row_dict(row),
                    "timeline": None if line is None else _timeline_dict(line),
                    "runs_read": len(runs),
                    "runs": [_data.run_dict(r) for r in table],
                    "requests": [steering.request_dict(r) for r in pending],
                    "trigger_refusal": refusal,
                }
            )
        response = await self._render(
            request,
            "job.html",
            name=name,
            row=row,
            definition=definition,
            snapshot=snapshot,
            pause=snapshot.pause_of(name),
            line=line,
            pending=pending,
            refusal=refusal,
            range_name=range_name or ("" if params.get("from") else "24h"),
            start=start,
            end=end,
            runs=table,
            runs_read=len(runs),
            instances=sorted({r.instance for r in runs}),
            filters={k: params.get(k, "") for k in ("status", "trigger", "instance")},
        )
        _timing(response, started)
        return response

    async def slot(self, request: Request) -> Response:
        """The explanation of one slot (a fragment for the panel, a page, or JSON)."""
        name = request.path_params["name"]
        check_name(name)
        text = request.path_params["slot"]
        written = parse_time(text, what="slot")  # parsed once
        check_readable(written, what="slot")  # 400 before the backend is read
        backend = await self.source.get()
        snapshot = await _data.read_snapshot(backend, self.views)
        definitions = snapshot.view.definitions.get(name)
        # As `anarchon explain` reads its SLOT: without an offset, in the job's zone.
        slot = written.read(definitions[0].zone if definitions else None, no_zone=no_carrier(name))
        story = await explain(backend, snapshot, name, slot.ms)
        if slot.note is not None:
            story = replace(story, summary=f"{story.summary} Note: {slot.note}")
        if _wants_json(request):
            return JSONResponse(story.to_dict())
        return await self._render(request, "slot.html", story=story, name=name)

    async def instances(self, request: Request) -> Response:
        """The instances page: heartbeat age, clock offset against the budget, jobs."""
        backend = await self.source.get()
        snapshot = await _data.read_snapshot(backend, self.views)
        rows = [(i, _data.clock_threshold_ms(backend, i.jobs)) for i in snapshot.view.instances]
        if _wants_json(request):
            now = snapshot.now_ms
            return JSONResponse(
                {
                    "now_ms": now,
                    "instances": [
                        {**i.to_dict(), "heartbeat_age_ms": now - i.heartbeat_ms, "warn_ms": warn}
                        for i, warn in rows
                    ],
                    "silent": [
                        {**i.to_dict(), "heartbeat_age_ms": now - i.heartbeat_ms}
                        for i in snapshot.view.silent
                    ],
                    "drift": [d.describe() for d in snapshot.view.drift],
                }
            )
        return await self._render(request, "instances.html", snapshot=snapshot, rows=rows)

    async def requests(self, request: Request) -> Response:
        """The run requests (triggers, retries) not claimed yet, due first; operators cancel
        them here (each one, or every one of a job)."""
        backend = await self.source.get()
        snapshot = await _data.read_snapshot(backend, self.views)
        found = await steering.pending_requests(backend) if snapshot.has_control else []
        if _wants_json(request):
            return JSONResponse(
                {"now_ms": snapshot.now_ms, "requests": [steering.request_dict(r) for r in found]}
            )
        return await self._render(request, "requests.html", snapshot=snapshot, pending=found)

    async def login(self, request: Request) -> Response:
        """Sign in with the operator token (GET: the form; POST: check it, set the cookie)."""
        if not self.guard.login_form:
            return await self._error(
                request, 404, "this dashboard has no operator token to sign in with"
            )
        if request.method == "GET":
            return await self._render(request, "login.html", failed=False)
        form = await _form(request)
        if not csrf_ok(request, _str(form.get("csrf"))):
            return _forbidden(request, "CSRF token missing or wrong: reload the page")
        client = _client(request)
        wait = self.sign_ins.wait_s(client)
        if wait:
            # Checked before the token: a locked-out address learns nothing, right or wrong.
            logger.warning("dashboard: sign-in refused from %s: too many failures", client)
            message = (
                f"too many failed sign-ins from {client}: at most {self.sign_ins.failures} in "
                f"{self.sign_ins.window_s:g} s; try again in {wait} s"
            )
            response = await self._error(request, 429, message)
            response.headers["retry-after"] = str(wait)
            return response
        if not self.guard.check_token(_str(form.get("token")) or ""):
            self.sign_ins.failed(client)
            logger.warning("dashboard: wrong operator token from %s", client)
            return await self._render(request, "login.html", status=403, failed=True)
        name = clean_name(_str(form.get("name")) or "operator")
        logger.info("dashboard: %s signed in from %s", name, _client(request))
        base = self._base(request)
        response = RedirectResponse(base + "/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            self.guard.session_value(name),
            httponly=True,
            samesite="strict",
            path=base + "/",
        )
        return response

    async def logout(self, request: Request) -> Response:
        """Sign out: the session is revoked (a copy of its cookie no longer acts) and the
        browser forgets it."""
        form = await _form(request)
        if not csrf_ok(request, _str(form.get("csrf"))):
            return _forbidden(request, "CSRF token missing or wrong: reload the page")
        name = self.guard.revoke(request.cookies.get(SESSION_COOKIE))
        if name is not None:
            logger.info("dashboard: %s signed out from %s", name, _client(request))
        base = self._base(request)
        response = RedirectResponse(base + "/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=base + "/")
        return response

    # -- actions ----------------------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        """Pause, resume or trigger a job, or cancel its pending run requests (one: the form's
        ``request`` id; else every one); or pause and resume all. Operators only, with the
        page's CSRF token (or the token as a bearer, for scripts)."""
        what = request.path_params["action"]
        job = request.path_params.get("name", ALL_JOBS)
        if not self.guard.writable:
            return _forbidden(request, "read-only dashboard: no operator token is configured")
        operator = await self.guard.operator(request)
        if operator is None:
            return _forbidden(request, "sign in as an operator to pause, resume, trigger or cancel")
        form = await _form(request)
        if not self.guard.bearer(request) and not csrf_ok(request, _str(form.get("csrf"))):
            return _forbidden(request, "CSRF token missing or wrong: reload the page")
        if job != ALL_JOBS:
            check_name(job)
        by = f"{operator}@dashboard"
        backend = await self.source.get()
        warning = None
        if what in ("pause", "trigger") and job != ALL_JOBS:
            # As 'anarchon pause' and 'trigger' warn: it works, and waits for a live carrier.
            snapshot = await _data.read_snapshot(backend, self.views)
            warning = carrier_warning(snapshot.view, job, what)
        if what == "pause":
            minutes = _int(_str(form.get("for_minutes")), "for_minutes", 0, 525_600, 0)
            until = None
            if minutes:
                until = await steering.backend_now_ms(backend) + minutes * 60_000
            await steering.pause(backend, job, until_ms=until, by=by)
            done = f"paused {_what(job)}" + (f" for {minutes} min" if minutes else "")
        elif what == "resume":
            done = await _resumed(backend, job)
        elif what == "trigger" and job != ALL_JOBS:
            request_ = await _trigger(request, backend, job, form, by)
            done = f"asked the cluster to run {job} now (request {request_.id[:8]})"
        elif what == "cancel" and job != ALL_JOBS:
            done, warning = await _cancelled(backend, job, _str(form.get("request")) or None, by)
        else:
            raise _BadRequest(
                f"unknown action {what!r} for {_what(job)}: a job takes pause, resume, trigger "
                "and cancel; /all (every job) takes pause and resume"
            )
        logger.info("dashboard: %s by %s from %s", done, by, _client(request))
        if warning is not None:
            logger.warning("dashboard: %s (%s by %s)", warning, what, by)
        if _wants_json(request):
            return JSONResponse({"ok": True, "done": done, "by": by, "warning": warning})
        return self._back(request, _str(form.get("next")) or "", done, warning)

    def _back(self, request: Request, back: str, done: str, warning: str | None) -> Response:
        """The redirect to the page an action came from (``back``, kept on the dashboard), with
        its message sealed for this browser."""
        base = self._base(request)
        if not back.startswith(base + "/") or back.startswith("//"):
            back = base + "/"
        path, _, query = back.partition("?")
        back = _without_messages(path, query)
        joiner = "&" if "?" in back else "?"
        # The message travels sealed for this browser (its CSRF cookie): a link that names a
        # message ("?flash=Cluster compromised") shows nothing.
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf()
        sealed = self.guard.seal_message(csrf, done, warning)
        response = RedirectResponse(back + joiner + urlencode({MESSAGE: sealed}), status_code=303)
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(
                CSRF_COOKIE, csrf, httponly=True, samesite="strict", path=base + "/"
            )
        return response


#: How the refusal of a Trigger names its force: the job page's button, and the form field.
FORCE_TEXT: Final = "'Trigger anyway' (the form field force=1)"


def _forced(form: Mapping[str, str]) -> bool:
    """The Trigger form asks to store the request even for a job no instance carries."""
    return form.get("force", "").strip().lower() in ("1", "true", "on", "yes")


class _Refused(Exception):
    """An action the cluster's state refuses (409): a Trigger of a job no instance carries."""


async def _trigger(
    request: Request, backend: Backend, job: str, form: Mapping[str, str], by: str
) -> RunRequest:
    """Store a request to run ``job`` once, unless :func:`~anarchon.registry.trigger_refusal`
    refuses it and the form does not force it: :class:`_Refused` (409) then, in the words of
    ``anarchon trigger`` (exit 2 there), naming this page's force."""
    refusal = None if _forced(form) else await _refusal(backend, job)
    if refusal is not None:
        message = f"{refusal}; {FORCE_TEXT} stores it anyway"
        logger.warning(
            "dashboard: refused trigger by %s from %s: %s", by, _client(request), message
        )
        raise _Refused(message)
    return await steering.trigger(backend, job, by=by)


async def _refusal(backend: Backend, job: str) -> str | None:
    """Why a Trigger of ``job`` is refused (:func:`~anarchon.registry.trigger_refusal`);
    None when it is not, or the backend keeps no registry to tell."""
    store = backend.registry()
    return None if store is None else await trigger_refusal(store, job)


#: The query parameter that carries an action's sealed message to the page it returns to.
MESSAGE: Final = "msg"
#: Dropped from a page's address when an action returns to it: the sealed message, and the
#: plain ``flash`` and ``warn`` of earlier versions.
MESSAGES: Final = (MESSAGE, "flash", "warn")


def _without_messages(path: str, query: str) -> str:
    """``path?query`` without an earlier action's message: a form returns to the page it was
    on, and the page's address kept the last action's message, so a warning (``no live
    instance carries job 'x'``) came back under every later action's message."""
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in MESSAGES]
    return path + (f"?{urlencode(kept)}" if kept else "")


async def _form(request: Request) -> dict[str, str]:
    """The POSTed form (``application/x-www-form-urlencoded``, the only kind the pages send),
    parsed without python-multipart; at most 64 KiB."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > 65_536:
            raise _BadRequest("form too large: at most 64 KiB")
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if body and kind != "application/x-www-form-urlencoded":
        raise _BadRequest(f"content-type {kind!r}: send application/x-www-form-urlencoded")
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return dict(pairs)


async def _resumed(backend: Backend, job: str) -> str:
    """Resume ``job`` (or the whole cluster) and say so; after the whole-cluster pause ends,
    each job paused on its own (still paused) is named."""
    ended = await steering.resume(backend, job)
    held = await steering.pauses(backend)
    if job != ALL_JOBS:
        done = f"resumed {job}" if ended else f"{job} was not paused on its own"
        cluster = next((p for p in held if p.job == ALL_JOBS), None)
        if cluster is None:
            return done if ended else f"{job} was not paused"
        # As 'anarchon resume JOB' notes: the job's slots stay skipped until the whole-cluster
        # pause ends too; saying only "resumed" would read as if it ran again.
        return f"{done}; it is still paused with every job by {cluster.by} ('Resume all' ends it)"
    done = "ended the whole-cluster pause" if ended else "the whole cluster was not paused"
    own = [p.job for p in held if p.job != ALL_JOBS]
    return done + (f"; still paused on their own: {', '.join(own)}" if own else "")


async def _cancelled(
    backend: Backend, job: str, request_id: str | None, by: str
) -> tuple[str, str | None]:
    """Cancel the pending run request ``request_id`` of ``job`` (None: every one of the job);
    say what was cancelled, and warn about each that an instance had claimed first (it runs)."""
    if request_id is not None:
        steering.check_request_id(request_id)
    pending = await steering.pending_requests(backend, job)
    chosen = [r for r in pending if request_id is None or r.id == request_id]
    if request_id is not None and not chosen:
        gone = f"request {request_id[:8]} of {job} is no longer pending: claimed or cancelled"
        return "nothing cancelled", gone
    outcome = await steering.cancel_requests(backend, chosen, by=by)
    late = [c for c in outcome if not c.cancelled]
    if request_id is None:
        done = f"cancelled {len(outcome) - len(late)} pending request(s) of {job}"
    elif late:
        done = f"could not cancel request {request_id[:8]} of {job}"
    else:
        done = f"cancelled the {chosen[0].kind} request {request_id[:8]} of {job}"
    warning = None
    if late:
        warning = "too late: " + "; ".join(
            f"request {c.request.id[:8]} was claimed first by {c.run.instance} "
            f"(run {c.run.status.value})"
            for c in late
        )
    return done, warning


def _what(job: str) -> str:
    return "every job" if job == ALL_JOBS else job


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _wants_json(request: Request) -> bool:
    """A JSON client: it asks ``?format=json`` or accepts ``application/json``. Every reply
    to it is JSON, errors included."""
    return request.query_params.get("format") == "json" or "application/json" in (
        request.headers.get("accept", "")
    )


def _json_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The JSON shape of every error reply: ``{"ok": false, "error": message}``."""
    return JSONResponse({"ok": False, "error": message}, status_code=status, headers=headers)


def _forbidden(request: Request, message: str) -> Response:
    logger.warning(
        "dashboard: refused %s %s from %s: %s",
        request.method,
        request.url.path,
        _client(request),
        message,
    )
    if _wants_json(request):
        return _json_error(403, message)
    return HTMLResponse(f"<!doctype html><title>403</title><p>403: {message}</p>", status_code=403)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no such page, a method not allowed), JSON for a JSON client."""
    assert isinstance(exc, HTTPException)
    if _wants_json(request):
        return _json_error(exc.status_code, exc.detail, exc.headers)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    """An unexpected error (logged with its traceback by the server): no detail in the reply,
    JSON for a JSON client."""
    if _wants_json(request):
        return _json_error(500, "Internal Server Error")
    return PlainTextResponse("Internal Server Error", status_code=500)


def _timing(response: Response, started: float) -> None:
    response.headers["server-timing"] = f"app;dur={(time.perf_counter() - started) * 1e3:.1f}"


def _filter(runs: list[Any], params: Any) -> list[Any]:
    status, trigger, instance = (params.get(k) for k in ("status", "trigger", "instance"))
    return [
        r
        for r in runs
        if (not status or _data.fate_of(r) == status or r.status.value == status)
        and (not trigger or r.trigger.value == trigger)
        and (not instance or r.instance == instance)
    ]


def _row_dict(row: _data.JobRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "expression": row.definition.expression,
        "zone": row.definition.zone,
        "words": row.words,
        "instances": list(row.instances),
        "next_slot_ms": row.next_slot_ms,
        "last_run": None if row.last_run is None else _data.run_dict(row.last_run),
        "running": [_data.run_dict(r) for r in row.running],
        "paused": None if row.pause is None else row.pause.to_dict(),
        "drift": None if row.drift is None else row.drift.describe(),
        "strip": [{"slot_ms": c.slot_ms, "fate": c.fate} for c in row.strip],
    }


def _timeline_dict(line: _data.Timeline) -> dict[str, Any]:
    return {
        "start_ms": line.start_ms,
        "end_ms": line.end_ms,
        "slots": line.slots,
        "counts": line.counts,
        "capped": line.capped,
        "walked_from_ms": line.walked_from_ms,
        "read_from_ms": line.read_from_ms,
    }


def build_app(
    target: Scheduler | Backend,
    token: str | TokenCheck | None,
    *,
    title: str,
    refresh_ms: int,
    registry_ttl_ms: int,
) -> Starlette:
    """The Starlette application of :func:`anarchon.web.dashboard`."""
    board = Dashboard(
        target, token, title=title, refresh_ms=refresh_ms, registry_ttl_ms=registry_ttl_ms
    )

    async def guarded(request: Request, handler: Any) -> Response:
        try:
            response: Response = await handler(request)
            return response
        except _BadRequest as exc:
            return await board._error(request, 400, str(exc))  # names the value and the rule
        except _Refused as exc:
            return await board._error(request, 409, str(exc))
        except ConfigurationError as exc:
            return await board._failure(request, exc, 400)
        except JobNotFound as exc:
            return await board._failure(request, exc, 404)
        except BackendError as exc:
            return await board._failure(request, exc, 503)
        except AnarchonError as exc:
            return await board._failure(request, exc, 409)

    def route(path: str, handler: Any, methods: list[str] | None = None) -> Route:
        async def endpoint(request: Request) -> Response:
            return await guarded(request, handler)

        return Route(path, endpoint, methods=methods or ["GET"])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        await board.source.close()

    app = Starlette(
        routes=[
            route("/", board.jobs),
            route("/instances", board.instances),
            route("/requests", board.requests),
            route("/jobs/{name}", board.job),
            route("/jobs/{name}/slots/{slot}", board.slot),
            route("/jobs/{name}/{action}", board.action, ["POST"]),
            route("/all/{action}", board.action, ["POST"]),
            route("/login", board.login, ["GET", "POST"]),
            route("/logout", board.logout, ["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, 500: _server_error},
    )
    app.state.dashboard = board
    return app
