"""Behind PgBouncer in transaction mode: ``notifications=off&prepared_statements=off`` works.

Runs only where a PgBouncer binary is available: ``$ANARCHON_PGBOUNCER`` (a command, e.g.
``env LD_LIBRARY_PATH=/opt/pgb/lib /opt/pgb/pgbouncer``) or ``pgbouncer`` on the PATH or in
/usr/sbin; ``make test`` installs Debian's ``pgbouncer`` package when it is missing
(scripts/services.sh). The test
starts its own PgBouncer on a port of this backend's range, in front of the shared server, and
stops it afterwards; as root it runs PgBouncer as ``nobody`` (PgBouncer refuses root).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon import BackendError, Overlap, RunStatus, Trigger
from anarchon.backend import ClaimRequest
from anarchon.backends.postgres import PostgresBackend
from tests.postgres.proxy import PORTS

SLOT = 1_800_000_000_000


def _command() -> list[str] | None:
    given = os.environ.get("ANARCHON_PGBOUNCER")
    if given:
        return shlex.split(given)
    # Debian's package (scripts/services.sh installs it for `make test`) puts it in /usr/sbin,
    # which is not on every user's PATH.
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    return [found] if found else None


@pytest.fixture
def bouncer() -> Iterator[str]:
    """A PgBouncer in transaction mode in front of 127.0.0.1:5432; yields its DSN."""
    command = _command()
    if command is None:
        pytest.skip("no PgBouncer binary (set ANARCHON_PGBOUNCER or put pgbouncer on the PATH)")
    # Not pytest's tmp_path: its parents are private to the user, and PgBouncer may run as
    # another one.
    tmp_path = Path(tempfile.mkdtemp(prefix="anarchon-pgbouncer-"))
    try:
        yield from _run(command, tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run(command: list[str], tmp_path: Path) -> Iterator[str]:
    port = PORTS.take_one()
    (tmp_path / "users.txt").write_text('"postgres" ""\n')
    (tmp_path / "pgbouncer.ini").write_text(
        "[databases]\n"
        "test = host=127.0.0.1 port=5432 dbname=test user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"auth_type = trust\nauth_file = {tmp_path / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 100\n"
        "unix_socket_dir =\nignore_startup_parameters = extra_float_digits\n"
    )
    if os.geteuid() == 0:
        tmp_path.chmod(0o777)
        command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command]
    log = (tmp_path / "pgbouncer.log").open("wb")
    proc = subprocess.Popen(
        [*command, str(tmp_path / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(
            ["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(port)], check=False
        ).returncode:
            assert proc.poll() is None, (tmp_path / "pgbouncer.log").read_text()
            assert time.monotonic() < deadline, "PgBouncer did not start"
            time.sleep(0.1)
        yield f"postgresql://postgres@127.0.0.1:{port}/test"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


async def _traffic(backend: PostgresBackend, tag: str) -> list[str]:
    errors = []
    for n in range(20):
        requests = [
            ClaimRequest(
                job=f"job{j}",
                slot=SLOT + n * 1000,
                run_id=uuid.uuid4().hex,
                token=uuid.uuid4().hex,
                instance=tag,
                trigger=Trigger.SCHEDULE,
                lease_ms=5_000,
                overlap=Overlap.ALLOW,
            )
            for j in range(4)
        ]
        try:
            for outcome in await backend.claim(requests):
                if outcome.ticket is not None:
                    ticket = await backend.renew(outcome.ticket)
                    await backend.finish(ticket, RunStatus.SUCCEEDED, None)
            await backend.history("job1", 5)
        except BackendError as exc:
            errors.append(str(exc))
    return errors


async def test_transaction_mode_without_notifications_and_prepared_statements(
    bouncer: str, schema: str
) -> None:
    url = f"{bouncer}?schema={schema}&notifications=off&prepared_statements=off"
    backends = [PostgresBackend.from_url(url) for _ in range(3)]
    try:
        for backend in backends:
            await backend.start()
        errors = await asyncio.gather(*(_traffic(b, f"i{k}") for k, b in enumerate(backends)))
        assert errors == [[], [], []]
        history = await backends[0].history("job1", 100)
        assert len(history) == 20 and len({r.fence for r in history}) == 20
    finally:
        for backend in backends:
            await backend.stop()
