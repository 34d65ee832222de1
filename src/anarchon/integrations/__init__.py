"""Integrations with the frameworks applications already run in.

* :mod:`anarchon.integrations.starlette`: a lifespan for Starlette and FastAPI, so the scheduler
  starts and stops with the application in every worker (uvicorn, gunicorn).
* :mod:`anarchon.integrations.django`: a Django app with settings, jobs in each app's
  ``cron.py``, database connection handling and ``python manage.py anarchon``.

Each is imported on its own; importing :mod:`anarchon` imports none of them, and none needs its
framework until it is used.
"""

from __future__ import annotations

__all__: list[str] = []
