"""NATS JetStream: a broker backend; JetStream's message de-duplication picks each slot's runner.

See :class:`NatsBackend` and docs/backends/nats.md. nats-py is imported only when the backend is
constructed (``pip install 'anarchon[nats]'``).
"""

from __future__ import annotations

from .backend import NatsBackend

__all__ = ["NatsBackend"]
