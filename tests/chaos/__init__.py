"""The fault suite: real processes, real backends, faults injected from outside, and counts.

``make chaos`` runs the long form (``python -m tests.chaos.run``); ``tests/chaos/test_chaos.py``
runs one trial of each fault inside ``make test``. See docs/guarantees.md ("The fault suite").
"""
