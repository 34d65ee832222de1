"""How long the Redis backend waits for Redis, and how long what it learnt stays true: every
duration of the backend in one place, each with why it is that long.

The modules read them as ``timings.NAME`` when they need them, so a test patches one of them
here, for every module that uses it.
"""

from __future__ import annotations

from typing import Final

#: Every call to Redis is abandoned after this long (BackendUnavailable), so a hung server
#: cannot hang the scheduler; a renewal gets at most a third of its lease (see
#: ._connection.renewal_timeout).
CALL_TIMEOUT_S: Final = 5.0
#: close() waits this long at most for calls still waiting for their answers (each ends within
#: CALL_TIMEOUT_S) to give their connections back, to close those too.
CLOSE_CALLS_WAIT_S: Final = CALL_TIMEOUT_S
#: subscribe() waits this long for the first subscription before returning anyway.
SUBSCRIBE_WAIT_S: Final = 2.0
#: A quiet subscription pings this often, so a dead connection is noticed and re-made.
PUBSUB_PING_S: Final = 10.0
#: close() lets announcements still being published finish for this long, then cancels them.
ANNOUNCE_WAIT_S: Final = 0.5
#: Slots within this long after a Redis (re)start may have been claimed on the server that was
#: there before (the uptime has 1 s resolution, instance clocks may be a little ahead).
RESTART_MARGIN_MS: Final = 2_000
#: How long one SCAN's answer serves the calls of one pass of open_runs() (it asks 2 000 jobs a
#: call): a run opened since is found by the next pass, as a run opened just after its job was
#: read always was.
OPEN_SCAN_FRESH_S: Final = 10.0
