"""gunicorn settings for an application that runs anarchon in its workers.

    gunicorn fastapi_app:app -c gunicorn.conf.py [--preload]

The rule: gunicorn must wait longer than anarchon drains. On SIGTERM the master gives each worker
``graceful_timeout`` seconds, then kills it; anarchon's ``stop()`` lets running handlers finish
for ``grace_ms``, then hands what is left over to another instance. A worker killed before that
hands nothing over: its runs wait for their leases to expire (``lease_ms``) before a backup
takes them. So ``graceful_timeout`` > longest request + ``grace_ms`` + a margin for the hand-over
and closing the backend (10 s is plenty).
"""

from __future__ import annotations

import os

GRACE_MS = int(os.environ.get("GRACE_MS", "30000"))  # the app reads the same variable
LONGEST_REQUEST_S = 5

bind = os.environ.get("BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "4"))
worker_class = "uvicorn_worker.UvicornWorker"
graceful_timeout = LONGEST_REQUEST_S + GRACE_MS // 1000 + 10
# A worker that leaves on its own (max_requests, or the old workers after a HUP reload) drains
# while the master still watches its heartbeat, which stops during the drain: give it as long.
timeout = graceful_timeout
