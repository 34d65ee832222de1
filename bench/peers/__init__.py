"""Worker scripts of the peers (arq, procrastinate, APScheduler 3), run from their own venv.

They import only the standard library, the peer and :mod:`bench.peers._record`: never anarchon.
"""
