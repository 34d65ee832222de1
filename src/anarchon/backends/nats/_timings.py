"""How long the NATS backend waits, retries, caches and looks again: every duration of the
backend in one place, each with why it is that long.

Several of them bound each other (a claim's retries, its requests' timeout and the duplicate
window; the buckets' retries and their calls' timeout), so they are read side by side here. The
modules read them as ``timings.NAME`` when they need them, so a test patches one of them here,
for every module that uses it.
"""

from __future__ import annotations

from typing import Final

# -- connecting (._client) ---------------------------------------------------------------------

#: Connecting: a few quick tries per server so start() fails within seconds; once connected the
#: client reconnects forever, every half second, and pings every 10 s so a dead TCP connection
#: is noticed in about 30 s instead of nats-py's default of several minutes.
CONNECT_TIMEOUT_S: Final = 2.0
CONNECT_ATTEMPTS: Final = 2
RECONNECT_WAIT_S: Final = 0.5
PING_INTERVAL_S: Final = 10
MAX_OUTSTANDING_PINGS: Final = 3

# -- requests and their retries (._connection, ._buckets, ._registry) --------------------------

#: One request (publish, get, API call) waits this long for its answer; a failover takes a few
#: seconds of "no responders", so a call is retried (a claim with the same id and token) for up
#: to CLAIM_RETRY_S (start() for up to START_RETRY_S), with short pauses, from RETRY_FIRST_S
#: growing to RETRY_CAP_S (an in-flight duplicate is settled in tens of ms), MAX_ATTEMPTS times
#: at most.
REQUEST_TIMEOUT_S: Final = 2.0
CLAIM_RETRY_S: Final = 8.0
START_RETRY_S: Final = 10.0
RETRY_FIRST_S: Final = 0.025
RETRY_CAP_S: Final = 0.5
MAX_ATTEMPTS: Final = 12
#: A call to a key-value bucket (the registry, the definitions sets, the pauses) is abandoned
#: after this long.
CALL_TIMEOUT_S: Final = 5.0
#: A key-value bucket's write or lookup is made again for up to this long while nobody answers
#: it (until_answered): a bucket just created, an election. Under CALL_TIMEOUT_S.
BUCKET_RETRY_S: Final = 3.0
#: Saving or reading a whole definitions set (several chunks) may take this long.
SET_TIMEOUT_S: Final = 60.0
#: A consumer left behind (its reader gone before it deleted it) expires after this long.
CONSUMER_INACTIVE_S: Final = 30.0
#: How late an unanswered publish may be failed after its wait: the acks' one timer wakes at most
#: this often (see ._wire.Acks).
EXPIRY_TICK_S: Final = 0.05

# -- the duplicate window (._window) -----------------------------------------------------------

#: How late past max_late_ms a claim can reach the stream. The core sends a scheduled claim only
#: while the slot is at most max_late_ms old (it checks at the slot and again after every pause
#: of its retry loop), the claim path publishes it only if its turn at the in-flight gate comes
#: while the slot is at most max_late_ms old, and every publish attempt of the claim starts
#: within CLAIM_RETRY_S of that turn (a manual run's, of the call); the last attempt's message
#: is on the wire before its request times out (REQUEST_TIMEOUT_S). anarchon's own connection
#: does not buffer publishes while it reconnects, so nothing is sent later. So a claim is
#: stored (if at all) at most max_late_ms + CLAIM_MARGIN_MS after its slot, by the claiming
#: instance's clock.
CLAIM_MARGIN_MS: Final = int((CLAIM_RETRY_S + REQUEST_TIMEOUT_S) * 1000)
#: A skip record is published only while its slot's claim id is surely still remembered: until
#: this long (at most a quarter of the window) before the window forgets it.
SKIP_SAFETY_MS: Final = 30_000

# -- claims (._claims) -------------------------------------------------------------------------

#: A batch's wins are announced a chunk at a time (._claims.NOTICE_CHUNK), or what it holds once
#: a win comes this long after the first one held.
NOTICE_HOLD_S: Final = 0.02
#: Claims not sent because their turn at the gate came after max_late_ms (the cluster is beyond
#: its capacity) are logged per slot at INFO, and counted in one WARNING this often at most.
TOO_LATE_WARN_S: Final = 10.0

# -- the read-back feed of the claims (._readback) ---------------------------------------------

#: How long a read waits for the feed to deliver the sequence it asks for, before reading it by
#: sequence. A claim is delivered as soon as it is stored, before the duplicate acks that point
#: at it, unless the feed lags behind a burst of thousands.
FEED_WAIT_S: Final = 0.5
#: A feed that delivered something in each FEED_WAIT_S (behind, not stalled) is waited for up
#: to this long in all.
FEED_WAIT_MAX_S: Final = 2.0
#: The feed stops after this long without a duplicate ack.
FEED_IDLE_S: Final = 60.0
#: A stalled feed is started again at most this often.
FEED_RESTART_S: Final = 5.0
#: The server sends an idle heartbeat this often (ns) when it has nothing to deliver; with flow
#: control (the server paces the feed to what this client has read) it is required.
HEARTBEAT_NS: Final = 5_000_000_000
#: The server deletes the consumer this long (ns) after this instance stopped listening to it.
INACTIVE_NS: Final = 30_000_000_000

# -- settling and upkeep (._settle) ------------------------------------------------------------

#: How often a running backend reads the stream's duplicate window (another instance may have
#: grown it, or shrunk it with shrink_window=True).
WINDOW_CHECK_S: Final = 60.0
#: Claims whose publish may have been stored unanswered and that the scheduler gave up on are
#: settled this often (see ._settle.Settler.settle); a manual run's claim once the core's 10 s
#: deadline for it is surely over (MANUAL_SETTLE_AFTER_MS).
SETTLE_EVERY_S: Final = 5.0
MANUAL_SETTLE_AFTER_MS: Final = 60_000
#: At stop(), the claims nobody runs now (wins kept from a failed batch, never handed to the
#: scheduler; claims whose publish may have been stored unanswered, a cancelled call's among
#: them) are settled within this long, ._connection.MAX_IN_FLIGHT at once (not behind the
#: results still queued).
CLOSE_SETTLE_S: Final = 5.0

# -- pauses (._control) ------------------------------------------------------------------------

#: How long an instance's claims trust a pause (or its absence) they read.
PAUSE_CACHE_S: Final = 1.0
#: A bucket the claims cannot read is warned about at most this often.
UNREADABLE_WARN_S: Final = 60.0

# -- the registry (._registry) -----------------------------------------------------------------

#: remove_silent looks for silent records in the last read of the registry (instances()) when it
#: is at most this old, instead of reading it again: see ._registry.NatsRegistry.remove_silent.
SNAPSHOT_MAX_S: Final = 60.0

# -- keeping the stream and buckets (._guard) --------------------------------------------------

#: A running backend looks whether its stream and buckets exist this often: one stream info
#: request each, per instance. Looks come sooner after a failed call or a reconnect.
GUARD_EVERY_S: Final = 30.0
#: Looks never come closer together than this, and while the stream is missing they come this
#: often, to make it again as soon as its window has passed.
LOOK_GAP_S: Final = 2.0
#: How often the guard checks whether a call failed or the client reconnected (no request).
TICK_S: Final = 0.5

# -- stopping (NatsBackend.stop, ._connection, ._client) ---------------------------------------

#: How long :meth:`NatsBackend.stop` lets the claims and the pauses end (the claims nobody runs
#: settled, within :data:`CLOSE_SETTLE_S`) before it closes the connection.
LET_GO_S: Final = 15.0
#: Ending the acks' subscription (one UNSUB written) waits at most this long.
ACKS_CLOSE_S: Final = 2.0
#: nats-py's close() waits for the bytes already written to reach the server, for ever if it
#: stopped reading them (paused, or a dead peer that never answers): after CLOSE_WAIT_S the
#: socket is dropped with what it still holds, and the close is given CLOSE_ABORT_S more. A
#: reconnect that waits as long for the lost connection to close has it dropped too
#: (._client.ReconnectWatch), so that the client tries the other servers.
CLOSE_WAIT_S: Final = 5.0
CLOSE_ABORT_S: Final = 2.0
