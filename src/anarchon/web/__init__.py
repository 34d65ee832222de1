"""The dashboard: every job, every slot's fate on a timeline, pause, resume and trigger.

An ASGI application (Starlette, server-rendered pages, a little plain JavaScript; every asset is
in the package)::

    from anarchon.web import dashboard

    app.mount("/cron", dashboard(scheduler, token=lambda request: request.user.name or None))

or alone: ``anarchon dashboard --backend URL``. Needs the ``web`` extra
(``pip install 'anarchon[web]'``). See docs/dashboard.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import MissingDependency
from ._auth import TokenCheck

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .._scheduler import Scheduler
    from ..backend import Backend

__all__ = ["TokenCheck", "dashboard"]


def dashboard(
    scheduler_or_backend: Scheduler | Backend,
    *,
    token: str | TokenCheck | None = None,
    title: str = "anarchon",
    refresh_ms: int = 5_000,
    registry_ttl_ms: int = 1_000,
) -> Starlette:
    """The dashboard as a Starlette application, to mount in an ASGI app or serve alone.

    :param scheduler_or_backend: a :class:`~anarchon.Scheduler` (the dashboard reads its
        backend while it runs) or a :class:`~anarchon.backend.Backend`, which the dashboard
        starts on its first request (``start_reader``: it creates nothing) and stops when the
        application shuts down (or ``await app.state.dashboard.source.close()``).
    :param token: None (the default): read-only, every action is refused with 403. A string
        (8 characters or more): operators sign in with it (or send it as
        ``Authorization: Bearer``). A callable: given the Starlette request, returns the
        operator's name, or None to refuse (it may be async): the host app's own auth.
    :param title: shown in the header and the browser's tab.
    :param refresh_ms: how often an open page refreshes its content (0: never).
    :param registry_ttl_ms: pages within this time share one read of the registry (instances
        refresh it every ``heartbeat_ms``, 5 s by default); 0 reads it for every page. Pauses
        and history are read for every page.
    """
    try:
        from ._app import build_app
    except ImportError as exc:  # pragma: no cover - exercised without the extra
        raise MissingDependency(
            f"the dashboard needs Starlette and Jinja2 ({exc.name} is missing): "
            "pip install 'anarchon[web]'"
        ) from exc

    return build_app(
        scheduler_or_backend,
        token,
        title=title,
        refresh_ms=refresh_ms,
        registry_ttl_ms=registry_ttl_ms,
    )
