"""The bench's own footprint on the servers: peak connections per measurement.

Sampled every quarter second: Redis ``connected_clients`` (on the bench's private server all
of them are the bench's) and PostgreSQL connections to the bench's database. A backend that
opens a connection per concurrent call shows up here before it exhausts a shared server.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["Footprint"]

EVERY_S = 0.25


class Footprint:
    """Peak connections per section, while :meth:`run` runs."""

    def __init__(self, redis_url: str | None, pg_dsn: str | None, pg_db: str) -> None:
        self.redis_url = redis_url
        self.pg_dsn = pg_dsn
        self.pg_db = pg_db
        self.section = "setup"
        self.peaks: dict[str, dict[str, int]] = {}

    def _note(self, kind: str, value: int) -> None:
        peaks = self.peaks.setdefault(self.section, {})
        peaks[kind] = max(peaks.get(kind, 0), value)

    async def run(self) -> None:
        redis: Any = None
        pg: Any = None
        try:
            if self.redis_url:
                from redis.asyncio import Redis

                redis = Redis.from_url(self.redis_url, socket_connect_timeout=2)
            if self.pg_dsn:
                import psycopg

                with contextlib.suppress(Exception):
                    pg = await psycopg.AsyncConnection.connect(self.pg_dsn, autocommit=True)
            while True:
                if redis is not None:
                    with contextlib.suppress(Exception):
                        info = await redis.info("clients")
                        self._note("redis_clients", int(info["connected_clients"]) - 1)
                if pg is not None:
                    with contextlib.suppress(Exception):
                        cur = await pg.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                            (self.pg_db,),
                        )
                        row = await cur.fetchone()
                        self._note("pg_connections", int(row[0]) - 1 if row else 0)
                await asyncio.sleep(EVERY_S)
        finally:
            if redis is not None:
                with contextlib.suppress(Exception):
                    await redis.aclose()
            if pg is not None:
                with contextlib.suppress(Exception):
                    await pg.close()
