"""NATS JetStream: a broker backend; JetStream's message de-duplication picks each slot's runner.

See :class:`NatsBackend` and docs/backends/nats.md. The claim path: :meth:`NatsBackend.claim` in
``_backend.py`` (the contract's methods), which hands each batch to ``_claims.py`` (publish
under the slot's message id, resolve a duplicate ack); the settling of unanswered claims is in
``_settle.py`` and the results in ``_results.py``; the calls to NATS and their retries in
``_connection.py``, opening the client and hearing of its outages in ``_client.py``, the
key-value buckets in ``_buckets.py`` and reads of many messages through a consumer in
``_reads.py``; the raw wire paths a claim's publish and ack take past nats-py's own (on its
internals, for speed) in ``_wire.py``; every timeout, retry period and wait, with why it is that
long, in ``_timings.py``. nats-py is imported only when the backend is constructed
(``pip install 'anarchon[nats]'``).
"""

from __future__ import annotations

from ._backend import NatsBackend
from ._control import NatsControl
from ._options import AccessKwargs
from ._registry import NatsRegistry

__all__ = ["AccessKwargs", "NatsBackend", "NatsControl", "NatsRegistry"]
