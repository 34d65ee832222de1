"""A NATS user with only the permissions docs/backends/nats.md lists runs everything, on both
server versions: two instance processes claim, beat and save their definitions; the real
``anarchon`` command lists the instances and jobs, pauses and resumes a job, triggers one and
reads its history; an instance that stops removes its record. The server logs no permissions
violation and no instance logs a NATS error.

The permissions are the page's block (``nats-permissions``) with the page's stream and prefix
replaced by the test's own, so the page cannot drift from what the backend needs.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.test_steering_processes import (
    PAUSE_BOUND_MS,
    Instances,
    anarchon,
    as_json,
    check_paused,
    history,
    now_ms,
    wait_for,
)
from tests.docs.blocks import block
from tests.nats.conftest import VERSIONS
from tests.nats.servers import BINARIES, NatsServer, configured_server, unique_names

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PAGE = "docs/backends/nats.md"
PASSWORD = "app-pw-5e1"
VIOLATION = re.compile(r"violation", re.IGNORECASE)


def permissions_block(stream: str, prefix: str) -> str:
    """The page's permissions block, for ``stream`` and ``prefix`` instead of the page's."""
    text = block(PAGE, "nats-permissions")
    assert "CRON" in text and '"cron.>"' in text, text
    return text.replace("CRON", stream).replace("cron.", prefix)


@pytest.fixture(params=VERSIONS)
def restricted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, NatsServer]]:
    """A server whose one user has the page's permissions; its URL for the test's stream."""
    stream, prefix = unique_names()
    body = (
        "authorization {\n  users = [\n    {\n      user: app\n"
        f'      password: "{PASSWORD}"\n'
        f"{permissions_block(stream, prefix)}\n"
        "    }\n  ]\n}\n"
    )
    server = configured_server(tmp_path / "server", BINARIES[request.param], body).start()
    try:
        query = f"stream={stream}&prefix={prefix}"
        yield f"nats://app:{PASSWORD}@127.0.0.1:{server.port}?{query}", server
    finally:
        server.stop()


def test_the_documented_permissions_are_enough(
    restricted: tuple[str, NatsServer], tmp_path: Path
) -> None:
    url, server = restricted
    fleet = Instances(url, tmp_path, "steer")
    try:
        fleet.spawn("w0", "w1")
        wait_for(lambda: len(fleet.slots("tick")) >= 3, "three slots of tick to run")
        listed = as_json(url, "instances")["instances"]
        assert sorted(i["id"] for i in listed) == ["w0", "w1"], listed
        jobs = {j["name"] for j in as_json(url, "jobs")["jobs"]}
        assert jobs == {"tick", "other"}, jobs

        anarchon(url, "pause", "tick", "--by", "perm-test")
        returned = now_ms()
        time.sleep((PAUSE_BOUND_MS + 4_000) / 1000)  # two slots or more past the bound
        resumed = now_ms()
        anarchon(url, "resume", "tick")
        check_paused(fleet, ["tick"], "perm-test", returned, resumed)

        anarchon(url, "trigger", "other")
        wait_for(
            lambda: any(r["trigger"] == "manual" for r in fleet.records(job="other")),
            "the triggered run of other",
        )
        runs = history(url, "tick")
        slots = [r["slot_ms"] for r in runs if r["status"] == "succeeded"]
        assert slots and len(slots) == len(set(slots)), runs

        fleet.procs["w1"].send_signal(signal.SIGTERM)
        fleet.procs["w1"].wait(60)
        wait_for(
            lambda: [i["id"] for i in as_json(url, "instances")["instances"]] == ["w0"],
            "the stopped instance's record to go",
        )
    finally:
        fleet.stop_all()
    logs = fleet.logs()
    assert "nats_error" not in logs and not VIOLATION.search(logs), logs
    server_log = server.log.read_text()
    assert not VIOLATION.search(server_log), server_log[-4000:]
