"""The ``anarchon`` command, run as a real process."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reaping import is_same, kill_if_same, start_time

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **env},
        timeout=120,
    )


def test_next_prints_iso_times_with_the_zone_offset() -> None:
    out = cli("next", "30 2 * * *", "--tz", "America/New_York", "-n", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT02:30:00-0[45]:00", line) for line in lines), lines


def test_next_stops_at_the_end_of_the_times_anarchon_handles() -> None:
    # Printed nothing, then OverflowError (exit 1).
    out = cli("next", "0 0 1 1 *", "-n", "10000")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "9998-01-01T00:00:00+00:00" and 7900 < len(lines) < 8000, lines[-3:]
    assert out.stderr.strip() == (
        f"anarchon next: printed {len(lines)} of the 10000 fire times asked: the times anarchon "
        "handles end at 9999-01-01T00:00:00Z"
    )
    leap = cli("next", "0 0 29 2 *", "--tz", "Pacific/Kiritimati", "-n", "10000")
    assert leap.returncode == 0 and leap.stdout.splitlines()[-1] == "9996-02-29T00:00:00+14:00"


def test_next_with_a_bad_expression_says_why() -> None:
    out = cli("next", "61 * * * *")
    assert out.returncode == 2
    assert "minute field '61'" in out.stderr


APP = (
    "from anarchon import Scheduler\n"
    "scheduler = Scheduler()\n"
    "@scheduler.job('beat', '* * * * * *', jitter_ms=0)\n"
    "def beat(ctx):\n"
    "    print('beat', ctx.fence, flush=True)\n"
)


def run_two_beats(tmp_path: Path, *extra: str) -> str:
    """``anarchon run cronapp:scheduler *extra`` until two beats ran, then SIGTERM; its output."""
    (tmp_path / "cronapp.py").write_text(APP)
    env = {**os.environ, "ANARCHON_DB": str(tmp_path / "app.db"), "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon", "run", "cronapp:scheduler", *extra],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # SIGTERM once two beats ran (not after a fixed sleep: under load the import alone can take
    # seconds, and a SIGTERM before run() installs its handler kills the process).
    seen: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while sum(line.startswith("beat ") for line in seen) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(seen) + rest
    assert proc.returncode == 0, output
    assert output.count("beat ") >= 2, output
    assert "stopped" in output
    return output


def test_run_and_history(tmp_path: Path) -> None:
    run_two_beats(tmp_path)

    out = cli("history", "beat", "-n", "2", cwd=tmp_path, ANARCHON_DB=str(tmp_path / "app.db"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["started", "(UTC)"]
    assert len(lines) == 3 and all("succeeded" in line for line in lines[1:])
    url = f"sqlite:///{tmp_path / 'app.db'}"
    assert (
        cli("history", "beat", "--backend", url).stdout
        == cli("history", "beat", cwd=tmp_path, ANARCHON_DB=str(tmp_path / "app.db")).stdout
    )


def test_a_reader_that_leaves_early_ends_the_command_quietly() -> None:
    # `anarchon next ... | head -1`: the pipe closes with 250 kB still to write.
    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon", "next", "* * * * * *", "-n", "10000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    errors = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(60) == 141, errors
    assert re.match(rb"\d{4}-\d\d-\d\dT", first) and errors == "", (first, errors)


def test_run_with_backend_uses_that_url_for_a_scheduler_made_without_one(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    run_two_beats(tmp_path, "--backend", f"sqlite:///{other}")
    assert not (tmp_path / "app.db").exists()
    out = cli("history", "beat", "--backend", f"sqlite:///{other}")
    assert out.returncode == 0 and out.stdout.count("succeeded") >= 2, out


def test_run_with_backend_refuses_a_scheduler_that_has_its_own(tmp_path: Path) -> None:
    (tmp_path / "ownapp.py").write_text(
        "from anarchon import MemoryBackend, Scheduler\nscheduler = Scheduler(MemoryBackend())\n"
    )
    out = cli("run", "ownapp:scheduler", "--backend", "redis://127.0.0.1:6379/0", cwd=tmp_path)
    assert out.returncode == 2
    assert "--backend applies to a Scheduler() made without a backend" in out.stderr
    assert "was given its own (memory)" in out.stderr


def test_a_scheduler_made_without_a_backend_reads_anarchon_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anarchon import RedisBackend, Scheduler, SQLiteBackend

    monkeypatch.setenv("ANARCHON_BACKEND", "redis://127.0.0.1:6379/0")
    made = Scheduler()
    assert isinstance(made.backend, RedisBackend)
    assert made.backend_url == "redis://127.0.0.1:6379/0"
    monkeypatch.delenv("ANARCHON_BACKEND")
    monkeypatch.setenv("ANARCHON_DB", str(tmp_path / "x.db"))
    default = Scheduler()
    assert isinstance(default.backend, SQLiteBackend) and default.backend_url is None


def test_run_with_a_bad_target_says_why() -> None:
    out = cli("run", "no_such_module_xyz:scheduler")
    assert out.returncode != 0 and "cannot import 'no_such_module_xyz'" in out.stderr
    out = cli("history", "x", "--backend", "ftp://host/")
    assert out.returncode == 2 and "unknown scheme 'ftp'" in out.stderr
    # An option the driver does not take is a usage error too, said before anything connects.
    out = cli("jobs", "--backend", "postgresql://u:pw@127.0.0.1:5432/test?bogus=1")
    assert out.returncode == 2 and 'invalid URI query parameter: "bogus"' in out.stderr, out
    assert "u:***@" in out.stderr and "cannot reach" not in out.stderr
    out = cli("jobs", "--backend", "redis://127.0.0.1:6379/0?bogus=1")
    assert out.returncode == 2 and "does not take: bogus" in out.stderr, out


@pytest.mark.slow
def test_demo_ends_with_no_duplicates_and_nothing_missed(tmp_path: Path) -> None:
    out = cli("demo", "--instances", "3", "--seconds", "8", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = out.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"slots: (\d+), runs: (\d+), duplicates: 0, missed: 0", summary)
    assert match and int(match.group(1)) >= 3 and match.group(1) == match.group(2), out.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_demo_cleanly_and_removes_its_folder(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """As ``run`` and ``dashboard`` do: SIGTERM killed the demo (-15), left its instances
    running and /tmp/anarchon-demo-*/demo.db behind. Only the demo is signalled (its own
    session), not its instances."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon", "demo", "--instances", "2", "--seconds", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temp)},
        start_new_session=True,
    )
    children: list[int] = []
    started: dict[int, int | None] = {}
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        assert " instances share " in first, first
        slot = proc.stdout.readline()  # the instances are up: one ran a slot
        assert slot.startswith("slot "), slot
        [folder] = list(temp.glob("anarchon-demo-*"))
        listed = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
        children = [int(pid) for pid in listed.split()]
        started = {pid: start_time(pid) for pid in children}
        assert len(children) == 2, children
        proc.send_signal(sig)
        proc.wait(timeout=60)
        gone = time.monotonic() + 30
        while any(is_same(pid, started=started[pid]) for pid in children if started[pid]):
            assert time.monotonic() < gone, f"demo instances {children} still run"
            time.sleep(0.2)
        rest, err = proc.stdout.read(), proc.stderr.read()
    finally:
        for pid in children:  # on a failure: the instances this test started, by pid
            if started.get(pid) is not None:
                kill_if_same(pid, started=started[pid])
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == 0, (proc.returncode, rest, err)
    assert "Traceback" not in err, err
    lines = rest.strip().splitlines()
    assert re.fullmatch(rf"stopped by {sig.name} after \d+\.\d of 120 s", lines[-2]), lines
    assert re.fullmatch(r"slots: \d+, runs: \d+, duplicates: 0, missed: 0", lines[-1]), lines
    assert not folder.exists() and list(temp.iterdir()) == []


def test_demo_refuses_a_run_too_short_to_see_a_slot() -> None:
    """``--seconds 1`` printed ``slots: 0`` and exited 0."""
    one_line_error(
        cli("demo", "--seconds", "1"),
        2,
        "--seconds: '1' is too short to see a slot",
        "give at least 3",
    )


def one_line_error(out: subprocess.CompletedProcess[str], code: int, *texts: str) -> None:
    """The command failed with ``code`` and one line on stderr containing every text."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    for text in texts:
        assert text in lines[0], lines[0]


def test_history_without_data_creates_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("ANARCHON_DB", "ANARCHON_BACKEND")}
    out = subprocess.run(
        [sys.executable, "-m", "anarchon", "history", "beat"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT / "src")},
        timeout=60,
    )
    one_line_error(out, 3, f"no anarchon data at {tmp_path / 'anarchon.db'}")
    assert list(tmp_path.iterdir()) == [], "history created a file"

    other = tmp_path / "other.db"
    other.write_bytes(b"")
    out = cli("history", "beat", "--backend", f"sqlite:///{other}")
    one_line_error(out, 3, f"no anarchon data at {other}")
    assert other.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


@pytest.mark.parametrize(
    ("args", "texts"),
    [
        (("history", "beat", "-n", "-1"), ("-n", "'-1'", "from 1 to")),
        (("history", "beat", "-n", "0"), ("-n", "'0'", "from 1 to")),
        (("history", "beat", "-n", "100001"), ("-n", "'100001'", "from 1 to 100000")),
        (("history", "no such/job"), ("job name 'no such/job'", "letters, digits")),
        (("next", "* * * * *", "-n", "-3"), ("-n", "'-3'", "from 1 to")),
        (("demo", "--instances", "0"), ("--instances", "'0'", "from 1 to 20")),
        (("demo", "--seconds", "-5"), ("--seconds", "'-5'")),
        (("--log-level", "bogus", "next", "* * * * *"), ("'bogus' is not a logging level", "INFO")),
        (("history", "x", "--backend", "postgresql://u:p@[::1/db"), ("malformed", "***")),
        (("history", "x", "--backend", "sqlite://"), ("names no file",)),
        (("history", "x", "--backend", "ftp://host/"), ("unknown scheme 'ftp'",)),
        (("next", "61 * * * *"), ("minute field '61'",)),
        (("next", "* * * * *", "--tz", "localtime"), ("time zone 'localtime'", "not an IANA")),
        # argparse took '-5m' for an option: "--until: expected one argument".
        *(
            (("pause", "tick", *until, "--backend", "memory://"), (said, "without a sign"))
            for until, said in (
                (("--until", "-5m"), "--until '-5m' is in the past"),
                (("--until=-5m",), "--until '-5m' is in the past"),
                (("--until", "-1h30m"), "--until '-1h30m' is in the past"),
                (("--until", "-1"), "--until '-1' is in the past"),
            )
        ),
        (("pause", "tick", "--until", "--by", "x"), ("--until: expected one argument",)),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: tuple[str, ...], texts: tuple[str]) -> None:
    one_line_error(cli(*args), 2, *texts)


def test_log_levels_are_case_insensitive() -> None:
    out = cli("--log-level", "debug", "next", "* * * * *", "-n", "1")
    assert out.returncode == 0, out.stderr


def test_the_backend_comes_from_the_flag_then_the_environment(tmp_path: Path) -> None:
    env_url = f"sqlite:///{tmp_path / 'env.db'}"
    flag_url = f"sqlite:///{tmp_path / 'flag.db'}"
    out = cli("history", "beat", ANARCHON_BACKEND=env_url)
    one_line_error(out, 3, str(tmp_path / "env.db"))
    out = cli("history", "beat", "--backend", flag_url, ANARCHON_BACKEND=env_url)
    one_line_error(out, 3, str(tmp_path / "flag.db"))
    out = cli("history", "beat", ANARCHON_BACKEND="mysql://admin:S3cret@h/x")
    one_line_error(out, 2, "unknown scheme 'mysql'", "admin:***@h")
    assert "S3cret" not in out.stdout + out.stderr


def _serve(app: Path, tmp_path: Path, *command: str) -> tuple[int, str]:
    """``anarchon run app:scheduler`` (or ``command``) in ``tmp_path`` until it has started
    (or 60 s passed, even if it prints nothing); then SIGTERM."""
    env = {k: v for k, v in os.environ.items() if k not in ("ANARCHON_DB", "ANARCHON_BACKEND")}
    proc = subprocess.Popen(
        list(command) or [sys.executable, "-m", "anarchon", "run", f"{app.stem}:scheduler"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT / "src")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while b" started with " not in seen and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break  # it exited
                seen += chunk
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()  # nothing once it exited
    return proc.returncode, (seen + rest).decode()


def readme_quick_start(tmp_path: Path) -> Path:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quick start\n\n(?:<!--[^\n]*-->\n)?```python\n(.*?)```", readme, re.S)
    assert code is not None
    app = tmp_path / "quickstart_app.py"
    app.write_text(code.group(1))
    return app


def test_the_readme_quick_start_runs_under_anarchon_run(tmp_path: Path) -> None:
    app = readme_quick_start(tmp_path)
    returncode, output = _serve(app, tmp_path)
    assert returncode == 0, output
    # The default SQLite file is named by its absolute path, once, when the scheduler starts
    # (its lease keeper's connection to the same file logged it a second time).
    assert output.count("SQLite database ") == 1, output
    assert f"SQLite database {tmp_path / 'anarchon.db'} (the default" in output
    # The first start made the tables: the line the README shows first.
    assert output.count(" migrated SQLite ") == 1, output
    assert f"migrated SQLite {tmp_path / 'anarchon.db'} from schema version 0 to " in output
    assert "stopped" in output


def test_the_readme_quick_start_shows_its_start_under_python(tmp_path: Path) -> None:
    # `python app.py` showed nothing at all (no logging configured; sync's first slot minutes
    # away): the sample sets up logging, so the lines the README shows are there at once.
    app = readme_quick_start(tmp_path)
    returncode, output = _serve(app, tmp_path, sys.executable, app.name)
    assert returncode == 0, output
    path = tmp_path / "anarchon.db"
    started = re.search(
        rf"^\S+ \S+ INFO anarchon\.scheduler scheduler \S+ started with 2 jobs on sqlite "
        rf"\(SQLiteBackend\('{re.escape(str(path))}'\)\)$",
        output,
        re.M,
    )
    assert started, output
    assert output.count("SQLite database ") == 1, output
    assert re.search(
        rf"INFO anarchon\.backends\.sqlite SQLite database {re.escape(str(path))} ", output
    )
    assert re.search(
        rf"INFO anarchon\.backends\.sqlite migrated SQLite {re.escape(str(path))} from schema "
        r"version 0 to \d+$",
        output,
        re.M,
    )
    assert "stopped" in output


def test_the_commands_do_not_log_the_sqlite_path(tmp_path: Path) -> None:
    # The path line is a scheduler's start; `anarchon jobs`, `history`, `health` (which name
    # the file in their own output) printed it on stderr at every call.
    url, _ = populated_sqlite(tmp_path)
    # health: 1, the recorded instance is not on this host
    for command, code in (
        (("jobs",), 0),
        (("history", "sync"), 0),
        (("instances",), 0),
        (("health",), 1),
    ):
        out = cli(*command, "--backend", url)
        assert out.returncode == code, (command, out.stdout, out.stderr)
        assert "SQLite database" not in out.stderr, (command, out.stderr)


def test_run_of_a_module_that_runs_its_scheduler_at_import_says_how_to_fix_it(
    tmp_path: Path,
) -> None:
    app = tmp_path / "eager_app.py"
    app.write_text(
        "from anarchon import Scheduler\n"
        "scheduler = Scheduler()\n"
        "@scheduler.job('beat', '* * * * *')\n"
        "def beat(ctx):\n"
        "    pass\n"
        "scheduler.run()\n"
    )
    returncode, output = _serve(app, tmp_path)
    assert returncode == 2, output
    last = output.strip().splitlines()[-1]
    assert "already run and stopped while 'eager_app' was imported" in last, output
    assert 'if __name__ == "__main__":' in last, output


@pytest.mark.parametrize(
    ("scheme", "url"),
    [
        ("postgresql", "postgresql://postgres@127.0.0.1:{port}/test"),
        ("redis", "redis://127.0.0.1:{port}/0"),
        ("nats", "nats://127.0.0.1:{port}"),
    ],
)
def test_health_json_answers_alike_when_the_backend_cannot_be_reached(
    scheme: str, url: str
) -> None:
    """docs/observability.md: ``--json`` prints its object on every backend, even closed."""
    from tests.ports import any_free

    closed = url.format(port=any_free())  # nothing listens there
    out = cli("health", "--json", ANARCHON_BACKEND=closed)
    assert out.returncode == 4, (out.stdout, out.stderr)
    report = json.loads(out.stdout)
    assert report["healthy"] is False and report["status"] == "failing", report
    [problem] = report["problems"]
    assert problem.startswith("the backend cannot be reached: ") and "\n" not in problem
    one_line_error(cli("health", ANARCHON_BACKEND=closed), 4, "the backend cannot be reached")


def test_health_json_says_there_is_no_data(tmp_path: Path) -> None:
    out = cli("health", "--json", "--backend", f"sqlite:///{tmp_path / 'none.db'}")
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert json.loads(out.stdout) == {
        "healthy": False,
        "status": "failing",
        "problems": [f"no anarchon data at {tmp_path / 'none.db'}"],
    }
    assert not (tmp_path / "none.db").exists()


def _help(*command: str) -> str:
    out = cli(*command, "--help")
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())


@pytest.mark.parametrize(
    "command",
    [
        "run",
        "history",
        "jobs",
        "instances",
        "health",
        "explain",
        "pause",
        "resume",
        "trigger",
        "requests",
        "cancel",
        "next",
        "dashboard",
        "demo",
    ],
)
def test_every_command_says_what_it_does_in_its_help(command: str) -> None:
    # `run`, `next`, `dashboard` and `demo` had no description under their usage.
    usage, description = cli(command, "--help").stdout.split("\n\n")[:2]
    assert usage.startswith(f"usage: anarchon {command}"), usage
    assert not description.lstrip().startswith(("positional arguments", "options")), description
    top = " ".join(cli("--help").stdout.split())
    assert " ".join(description.split()) in top  # the same line as in `anarchon --help`


def test_the_help_gives_the_limits_and_units() -> None:
    assert "how many runs, 1 to 100000 (default 20)" in _help("history")
    assert "how many, 1 to 10000 (default 5)" in _help("next")
    assert "(units s, m, h, d, w); at most 10 years ahead" in _help("pause")
    assert "print one JSON object (docs/observability.md)" in _help("health")
    assert "print one JSON object (docs/operations.md)" in _help("jobs")


def test_an_unknown_option_points_to_the_commands_help() -> None:
    # It said "(see 'anarchon --help')", whose text has no word of `jobs`' options.
    one_line_error(
        cli("jobs", "--jsn"),
        2,
        "anarchon jobs: unrecognized arguments: --jsn",
        "(see 'anarchon jobs --help')",
    )
    one_line_error(cli("next", "* * * * *", "extra"), 2, "(see 'anarchon next --help')")
    one_line_error(cli("jobs", "-n", "3"), 2, "(see 'anarchon jobs --help')")


def test_every_json_output_is_indented_alike(tmp_path: Path) -> None:
    # `trigger --json` printed the stored request's compact, key-sorted form; every other
    # command indents by two.
    url, now = populated_sqlite(tmp_path)
    slot = datetime_text(now - now % 60_000)
    for argv in (
        ("jobs",),
        ("instances",),
        ("history", "sync"),
        ("explain", "sync", slot),
        ("pause", "sync"),
        ("resume", "sync"),
        ("trigger", "sync"),
        ("requests",),
        ("cancel", "--job", "sync"),
        ("health", "--instance", "w0"),
    ):
        out = cli(*argv, "--json", "--backend", url)
        assert out.returncode in (0, 1), (argv, out.stdout, out.stderr)
        assert out.stdout == json.dumps(json.loads(out.stdout), indent=2) + "\n", (argv, out.stdout)
    out = cli("trigger", "sync", "--json", "--backend", url)
    request = json.loads(out.stdout)
    assert request["job"] == "sync" and request["trigger"] == "manual", request
    # health's report when there is nothing to check (printed compact too)
    out = cli("health", "--json", "--backend", f"sqlite:///{tmp_path / 'none.db'}")
    assert out.returncode == 3, out.stderr
    assert json.loads(out.stdout)["status"] == "failing"
    assert out.stdout == json.dumps(json.loads(out.stdout), indent=2) + "\n", out.stdout


def datetime_text(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def populated_sqlite(tmp_path: Path) -> tuple[str, int]:
    """A SQLite file whose registry holds one instance carrying ``sync``: its URL, and the
    backend's time then."""
    import asyncio

    from anarchon import SQLiteBackend
    from anarchon.registry import JobDefinition, record_instance
    from tests.records import instance_record

    async def populate() -> int:
        backend = SQLiteBackend(tmp_path / "a.db")
        await backend.start()
        now = await backend.server_time_ms()
        assert now is not None
        job = JobDefinition(name="sync", expression="* * * * *", zone="UTC")
        await record_instance(backend.registry(), instance_record("w0", job, beat=now))
        await backend.stop()
        return now

    return f"sqlite:///{tmp_path / 'a.db'}", asyncio.run(populate())


THREAD_APP = (
    "import threading\n"
    "from anarchon import Scheduler\n"
    "scheduler = Scheduler()\n"
    "@scheduler.job('spawner', '* * * * * *', jitter_ms=0)\n"
    "async def spawner(ctx):\n"
    "    if not any(t.name == 'never-ends' for t in threading.enumerate()):\n"
    "        threading.Thread(target=threading.Event().wait, name='never-ends').start()\n"
    "        print('spawned', flush=True)\n"
)


def test_run_exits_after_sigterm_though_a_handler_left_a_non_daemon_thread(
    tmp_path: Path,
) -> None:
    # Every option at its default (SQLite ./anarchon.db). Python's own exit waited for the
    # thread for ever: the process never ended after SIGTERM.
    (tmp_path / "threadapp.py").write_text(THREAD_APP)
    env = {k: v for k, v in os.environ.items() if k not in ("ANARCHON_DB", "ANARCHON_BACKEND")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon", "run", "threadapp:scheduler"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT / "src")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while not any(line.startswith("spawned") for line in seen) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        rest, _ = proc.communicate(timeout=45)
        took = time.monotonic() - began
    finally:
        proc.kill()  # nothing once it exited
    output = "".join(seen) + rest
    assert proc.returncode == 0, output
    assert took < 40, (took, output)
    warning = [line for line in output.splitlines() if "WARNING" in line and "'never-ends'" in line]
    assert len(warning) == 1 and "exiting without them" in warning[0], output
    out = cli("history", "spawner", "-n", "50", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "succeeded" in out.stdout, out.stdout


def _stop_while_starting(tmp_path: Path, scheme: str, *extra: str) -> tuple[int, str, float]:
    """``anarchon run cronapp:scheduler *extra`` on a ``scheme`` backend that accepts and never
    answers (tests.ports.silent_server), SIGTERM once its start reached it: the exit code, the
    output, and how long it took to exit after the signal."""
    from tests.ports import silent_server

    (tmp_path / "cronapp.py").write_text(APP)
    with silent_server() as (port, accepted):
        url = f"redis://127.0.0.1:{port}" if scheme == "redis" else f"{scheme}://127.0.0.1:{port}/x"
        url += "?timeout_ms=60000" if scheme == "postgresql" else ""
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "anarchon",
                "run",
                "cronapp:scheduler",
                "--backend",
                url,
                *extra,
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            # The loop's signal handlers are installed before the start connects.
            assert accepted.wait(60), "the start never reached the backend"
            proc.send_signal(signal.SIGTERM)
            began = time.monotonic()
            output, _ = proc.communicate(timeout=90)
            took = time.monotonic() - began
        finally:
            proc.kill()  # nothing once it exited
    return proc.returncode, output, took


@pytest.mark.parametrize("scheme", ["postgresql", "redis"])
def test_a_stop_while_the_backend_does_not_answer_exits_0(tmp_path: Path, scheme: str) -> None:
    # A listener that accepts and never answers: the start waits on it (up to its timeout: 5 s
    # on Redis, 60 s asked of PostgreSQL), and SIGTERM comes meanwhile. Before: exit 4,
    # "cannot connect", as a failed start; then exit 0 once the timeout ran out. Now the start
    # is cancelled at once (start_cancelled).
    code, output, took = _stop_while_starting(tmp_path, scheme)
    assert code == 0, output
    assert "the start was cancelled and the scheduler never started" in output, output
    assert "WARNING" in output and "Traceback" not in output, output
    assert " started with " not in output, output
    assert took < 30, (took, output)  # not the 60 s PostgreSQL was given


def test_a_stop_that_cancels_the_start_does_not_wait_for_a_last_scrape(tmp_path: Path) -> None:
    # --metrics-linger serves the final counts until a scrape reads them; a stop that cancelled
    # the start (the backend not answering) left none to read, yet the command served on for
    # all of --metrics-linger (60 s here) after the operator's SIGTERM. The rest at defaults.
    from tests.ports import any_free

    metrics = ["--metrics-port", str(any_free()), "--metrics-host", "127.0.0.1"]
    code, output, took = _stop_while_starting(tmp_path, "redis", *metrics, "--metrics-linger", "60")
    assert code == 0, output
    assert "the start was cancelled and the scheduler never started" in output, output
    assert "the start was cancelled: no final metrics to serve, not lingering" in output, output
    assert "serving the final metrics" not in output, output
    assert took < 30, (took, output)  # not the 60 s of --metrics-linger


def test_the_json_of_a_run_gives_its_skip_cause(tmp_path: Path) -> None:
    # history --json and explain --json gave a skipped run's reason (words for people) but not
    # its SkipCause, the kind a script can read; every option at its default (SQLite).
    import asyncio

    from anarchon import SkipCause, SQLiteBackend
    from anarchon.backend import TOO_LATE
    from anarchon.testing._requests import request

    url, now = populated_sqlite(tmp_path)
    slot = now - now % 60_000 - 60_000

    async def skip() -> None:
        backend = SQLiteBackend(tmp_path / "a.db")
        await backend.start()
        words = f"{TOO_LATE}w0 reached it late"
        late = request("sync", slot, skip_reason=words, skip_cause=SkipCause.TOO_LATE)
        await backend.claim([late])
        await backend.stop()

    asyncio.run(skip())
    out = cli("history", "sync", "--json", "--backend", url)
    assert out.returncode == 0, out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    assert (run["status"], run["reason"], run["skip_cause"]) == (
        "skipped",
        "too late: w0 reached it late",
        "too_late",
    )
    out = cli("explain", "sync", datetime_text(slot), "--json", "--backend", url)
    assert out.returncode == 0, out.stderr
    fate = json.loads(out.stdout)
    assert (fate["fate"], fate["skip_cause"]) == ("skipped", "too_late"), fate
    assert [a["skip_cause"] for a in fate["attempts"]] == ["too_late"], fate
    out = cli("explain", "sync", datetime_text(slot + 3_600_000), "--json", "--backend", url)
    assert json.loads(out.stdout)["skip_cause"] is None, out.stdout
