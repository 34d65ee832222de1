"""anarchon's benchmarks: ``python -m bench`` (or ``make bench``) measures and writes results.md.

Nothing here is imported by anarchon, and this package imports nothing at import time, so the
peers' worker scripts in :mod:`bench.peers` run from the peers' own virtualenv (which has no
anarchon) with ``python -m bench.peers.<name>``.
"""
