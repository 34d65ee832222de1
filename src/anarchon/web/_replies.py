"""Requests in, replies out: what every route of the dashboard reads from a request (its query
parameters, its form, whether it wants JSON, its client) and the replies it sends when it
refuses or fails (JSON for a JSON client, a short page or plain text else).

Nothing here knows about jobs, pages or actions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from .._times import no_carrier, parse_time_ms

__all__ = [
    "BadRequest",
    "add_timing",
    "client_of",
    "forbidden",
    "http_error",
    "int_param",
    "json_error",
    "read_form",
    "server_error",
    "str_or_none",
    "time_param",
    "wants_json",
]

logger = logging.getLogger("anarchon.web")


class BadRequest(Exception):
    """A request the dashboard cannot read (400): its message names the value and the rule."""


def int_param(value: str | None, name: str, low: int, high: int, default: int) -> int:
    """The whole number ``value`` of the parameter ``name``, from ``low`` to ``high``;
    ``default`` when it is absent or empty, :class:`BadRequest` otherwise."""
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise BadRequest(f"{name}={value!r} must be a whole number from {low} to {high}")
    return number


def time_param(value: str | None, name: str, default: int, job: str, zone: str | None) -> int:
    """A time parameter about ``job``: epoch ms or ISO 8601 (without an offset: in the job's
    ``zone``, as on the command line) within the times anarchon handles (InvalidOption, so
    400, naming it and the rule otherwise)."""
    if value is None or value == "":
        return default
    return parse_time_ms(value, zone, what=name, no_zone=no_carrier(job))


async def read_form(request: Request) -> dict[str, str]:
    """The POSTed form (``application/x-www-form-urlencoded``, the only kind the pages send),
    parsed without python-multipart; at most 64 KiB."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > 65_536:
            raise BadRequest("form too large: at most 64 KiB")
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if body and kind != "application/x-www-form-urlencoded":
        raise BadRequest(f"content-type {kind!r}: send application/x-www-form-urlencoded")
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return dict(pairs)


def str_or_none(value: object) -> str | None:
    """``value`` if it is a string (a form field as sent), else None."""
    return value if isinstance(value, str) else None


def client_of(request: Request) -> str:
    """The client's address, as the logs name it (``?`` when the server does not tell)."""
    return request.client.host if request.client else "?"


def wants_json(request: Request) -> bool:
    """A JSON client: it asks ``?format=json`` or accepts ``application/json``. Every reply
    to it is JSON, errors included."""
    return request.query_params.get("format") == "json" or "application/json" in (
        request.headers.get("accept", "")
    )


def json_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The JSON shape of every error reply: ``{"ok": false, "error": message}``."""
    return JSONResponse({"ok": False, "error": message}, status_code=status, headers=headers)


def forbidden(request: Request, message: str) -> Response:
    """The 403 reply to a request the dashboard refuses (no operator, no CSRF token), logged
    with its client."""
    logger.warning(
        "dashboard: refused %s %s from %s: %s",
        request.method,
        request.url.path,
        client_of(request),
        message,
    )
    if wants_json(request):
        return json_error(403, message)
    return HTMLResponse(f"<!doctype html><title>403</title><p>403: {message}</p>", status_code=403)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no such page, a method not allowed), JSON for a JSON client."""
    assert isinstance(exc, HTTPException)
    if wants_json(request):
        return json_error(exc.status_code, exc.detail, exc.headers)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


async def server_error(request: Request, exc: Exception) -> Response:
    """An unexpected error (logged with its traceback by the server): no detail in the reply,
    JSON for a JSON client."""
    if wants_json(request):
        return json_error(500, "Internal Server Error")
    return PlainTextResponse("Internal Server Error", status_code=500)


def add_timing(response: Response, started: float) -> None:
    """Tell the browser how long the page took (``server-timing: app``) since ``started``
    (:func:`time.perf_counter`)."""
    response.headers["server-timing"] = f"app;dur={(time.perf_counter() - started) * 1e3:.1f}"
