"""One module per backend, each behind the :mod:`anarchon.backend` contract.

Drivers are imported only when a backend is constructed, so ``pip install anarchon`` needs no
Redis, PostgreSQL or NATS client.
"""
