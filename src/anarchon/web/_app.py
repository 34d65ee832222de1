"""The dashboard's Starlette application: its routes (the jobs, job, slot, instances and requests
pages, sign-in and sign-out, and the operators' actions) and :func:`build_app`.

A route reads the cluster with ``_data`` (from the backend ``_source`` starts), renders it with
``_render``, changes it with ``_actions``, and reads its request and refuses with ``_replies``.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import steering
from .._job import check_name
from .._options import HISTORY_LIMIT
from .._redact import redact_url
from .._scheduler import Scheduler
from .._times import EARLIEST_MS, check_readable, no_carrier, parse_time
from ..backend import Backend
from ..control import ALL_JOBS
from ..errors import AnarchonError, BackendError, ConfigurationError, JobNotFound
from ..registry import carrier_warning
from . import _actions, _data
from ._actions import MESSAGE, without_messages
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
from ._render import FILTERS, RANGES, filter_runs, row_dict, templates, timeline_dict
from ._replies import (
    BadRequest,
    add_timing,
    client_of,
    forbidden,
    http_error,
    int_param,
    json_error,
    read_form,
    server_error,
    str_or_none,
    time_param,
    wants_json,
)
from ._source import Source

__all__ = ["build_app"]

logger = logging.getLogger("anarchon.web")
HERE: Final = Path(__file__).resolve().parent
#: The request header (``1``) of the pages' own fetches (a refresh, the slot panel): the content
#: without the page around it.
PARTIAL_HEADER: Final = "x-anarchon-partial"
#: Runs a job page's history table shows at most (of those its filters keep).
HISTORY_ROWS: Final = 200
#: Jobs a page of the jobs page shows unless ``per`` says otherwise.
JOBS_PER_PAGE: Final = 50


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
        """The dashboard of ``target``, ``token`` as :func:`anarchon.web.dashboard` takes it.
        ValueError for a ``refresh_ms`` outside 0 to 3 600 000 or a ``registry_ttl_ms`` outside
        0 to 60 000; :class:`Guard` raises for a bad ``token``."""
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
        self.env = templates()

    # -- helpers ----------------------------------------------------------------------------

    def _base(self, request: Request) -> str:
        """The path the dashboard is mounted at (``""`` at the root), without its last ``/``."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def _render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """The page ``template`` with ``context`` and what every page shows (the operator, the
        CSRF token, an action's message), and the headers every page sends."""
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
            here=without_messages(request.url.path, request.url.query),
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
        """The error reply naming ``exc`` (its type and message, any URL's secret redacted)."""
        return await self._error(request, status, redact_url(f"{type(exc).__name__}: {exc}"))

    async def _error(self, request: Request, status: int, message: str) -> Response:
        """An error reply: ``{"ok": false, "error": message}`` for a JSON client
        (:func:`~._replies.wants_json`), else the error page."""
        if wants_json(request):
            return json_error(status, message)
        return await self._render(request, "error.html", status=status, message=message)

    # -- pages ------------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        """The jobs page: every job with its next slot, last run, pause and strip."""
        started = time.perf_counter()
        params = request.query_params
        query = params.get("q", "")[:200]
        per = int_param(params.get("per"), "per", 10, 500, JOBS_PER_PAGE)
        backend = await self.source.get()
        snapshot = await _data.read_snapshot(backend, self.views)
        names = _data.select_jobs(snapshot, query)
        pages = max(1, math.ceil(len(names) / per))
        page = min(int_param(params.get("page"), "page", 1, 1_000_000, 1), pages)
        shown = names[(page - 1) * per : page * per]
        rows = await _data.job_rows(backend, snapshot, shown)
        if wants_json(request):
            return JSONResponse(
                {
                    "now_ms": snapshot.now_ms,
                    "total": len(names),
                    "page": page,
                    "pages": pages,
                    "jobs": [row_dict(r) for r in rows],
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
        add_timing(response, started)
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
        limit = int_param(params.get("runs"), "runs", 100, HISTORY_LIMIT.high, 10_000)
        runs = await backend.history(name, limit)
        if not definitions and not runs:
            raise unknown_job(name)
        range_name = params.get("range", "")
        if range_name and range_name not in RANGES:
            raise BadRequest(f"range={range_name!r} must be one of {', '.join(RANGES)}")
        now = snapshot.now_ms
        zone = definitions[0].zone if definitions else None
        if params.get("from") or params.get("to"):
            end = time_param(params.get("to"), "to", now, name, zone)
            start = time_param(
                params.get("from"), "from", max(EARLIEST_MS, end - RANGES["24h"]), name, zone
            )
            if start >= end:
                raise BadRequest(f"from ({start}) must be before to ({end})")
        else:
            span = RANGES[range_name or "24h"]
            end = time_param(params.get("end"), "end", now, name, zone)
            start = end - span
            if start < EARLIEST_MS:
                raise BadRequest(
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
                raise BadRequest(f"{key}={given!r} must be one of {', '.join(allowed)}")
        table = filter_runs(runs, params)[:HISTORY_ROWS]
        row = (await _data.job_rows(backend, snapshot, [name]))[0] if definitions else None
        pending = await steering.pending_requests(backend, name) if snapshot.has_control else []
        refusal = None
        if snapshot.has_control and not snapshot.view.carriers(name):
            refusal = await _actions.refusal_of(backend, name)  # its page offers "Trigger anyway"
        if wants_json(request):
            return JSONResponse(
                {
                    "now_ms": now,
                    "job": name,
                    "definition": None if definition is None else definition.to_dict(),
                    "row": None if row is None else row_dict(row),
                    "timeline": None if line is None else timeline_dict(line),
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
        add_timing(response, started)
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
        if wants_json(request):
            return JSONResponse(story.to_dict())
        return await self._render(request, "slot.html", story=story, name=name)

    async def instances(self, request: Request) -> Response:
        """The instances page: heartbeat age, clock offset against the budget, jobs."""
        backend = await self.source.get()
        snapshot = await _data.read_snapshot(backend, self.views)
        rows = [(i, _data.clock_threshold_ms(backend, i.jobs)) for i in snapshot.view.instances]
        if wants_json(request):
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
        if wants_json(request):
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
        form = await read_form(request)
        if not csrf_ok(request, str_or_none(form.get("csrf"))):
            return forbidden(request, "CSRF token missing or wrong: reload the page")
        client = client_of(request)
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
        if not self.guard.check_token(str_or_none(form.get("token")) or ""):
            self.sign_ins.failed(client)
            logger.warning("dashboard: wrong operator token from %s", client)
            return await self._render(request, "login.html", status=403, failed=True)
        name = clean_name(str_or_none(form.get("name")) or "operator")
        logger.info("dashboard: %s signed in from %s", name, client_of(request))
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
        form = await read_form(request)
        if not csrf_ok(request, str_or_none(form.get("csrf"))):
            return forbidden(request, "CSRF token missing or wrong: reload the page")
        name = self.guard.revoke(request.cookies.get(SESSION_COOKIE))
        if name is not None:
            logger.info("dashboard: %s signed out from %s", name, client_of(request))
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
            return forbidden(request, "read-only dashboard: no operator token is configured")
        operator = await self.guard.operator(request)
        if operator is None:
            return forbidden(request, "sign in as an operator to pause, resume, trigger or cancel")
        form = await read_form(request)
        if not self.guard.bearer(request) and not csrf_ok(request, str_or_none(form.get("csrf"))):
            return forbidden(request, "CSRF token missing or wrong: reload the page")
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
            minutes = int_param(str_or_none(form.get("for_minutes")), "for_minutes", 0, 525_600, 0)
            done = await _actions.paused(backend, job, minutes, by)
        elif what == "resume":
            done = await _actions.resumed(backend, job)
        elif what == "trigger" and job != ALL_JOBS:
            request_ = await _actions.triggered(request, backend, job, form, by)
            done = f"asked the cluster to run {job} now (request {request_.id[:8]})"
        elif what == "cancel" and job != ALL_JOBS:
            done, warning = await _actions.cancelled(
                backend, job, str_or_none(form.get("request")) or None, by
            )
        else:
            raise BadRequest(
                f"unknown action {what!r} for {_actions.job_words(job)}: a job takes pause, "
                "resume, trigger and cancel; /all (every job) takes pause and resume"
            )
        logger.info("dashboard: %s by %s from %s", done, by, client_of(request))
        if warning is not None:
            logger.warning("dashboard: %s (%s by %s)", warning, what, by)
        if wants_json(request):
            return JSONResponse({"ok": True, "done": done, "by": by, "warning": warning})
        return self._back(request, str_or_none(form.get("next")) or "", done, warning)

    def _back(self, request: Request, back: str, done: str, warning: str | None) -> Response:
        """The redirect to the page an action came from (``back``, kept on the dashboard), with
        its message sealed for this browser."""
        base = self._base(request)
        if not back.startswith(base + "/") or back.startswith("//"):
            back = base + "/"
        path, _, query = back.partition("?")
        back = without_messages(path, query)
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
        """``handler``'s reply, or the error reply its exception stands for."""
        try:
            response: Response = await handler(request)
            return response
        except BadRequest as exc:
            return await board._error(request, 400, str(exc))  # names the value and the rule
        except _actions.Refused as exc:
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
        """A route to ``handler``, :func:`guarded`; GET unless ``methods`` says otherwise."""

        async def endpoint(request: Request) -> Response:
            """``handler``'s reply to ``request``, or its error's (:func:`guarded`)."""
            return await guarded(request, handler)

        return Route(path, endpoint, methods=methods or ["GET"])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        """At shutdown, stop the backend if the dashboard started it."""
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
        exception_handlers={HTTPException: http_error, 500: server_error},
    )
    app.state.dashboard = board
    return app
