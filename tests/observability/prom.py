"""A real Prometheus server for the tests: Debian's ``prometheus`` package, installed when missing
(CI runs as root), started on a free loopback port with a temporary configuration and storage,
queried through its HTTP API, and stopped by its pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Final

from tests.debian import ensure_packages
from tests.ports import any_free

BINARY: Final = Path("/usr/bin/prometheus")


def ensure_installed() -> str | None:
    """Install Debian's ``prometheus`` package if the server is missing; None when it is there,
    else why it could not be installed."""
    return ensure_packages(["prometheus"], [BINARY], timeout_s=600)


class Prometheus:
    """One Prometheus server scraping ``targets`` (``host:port``) every second."""

    def __init__(self, tmp: Path, targets: list[str], rules: str | None = None) -> None:
        self.port = any_free()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = tmp / "prometheus"
        self.dir.mkdir()
        self.config = self.dir / "prometheus.yml"
        rule_files = []
        if rules is not None:
            (self.dir / "rules.yml").write_text(rules)
            rule_files.append(str(self.dir / "rules.yml"))
        self.config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "rule_files": rule_files,
                    "global": {
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        "evaluation_interval": "1s",
                    },
                    "scrape_configs": [
                        {"job_name": "anarchon", "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        self.log = self.dir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> None:
        """Start the server and wait until it is ready."""
        with self.log.open("wb") as handle:
            self.proc = subprocess.Popen(
                [
                    str(BINARY),
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited early:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready:\n{self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server by its pid (SIGTERM, then SIGKILL)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a successful answer."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def names(self) -> set[str]:
        """Every metric name Prometheus holds."""
        return set(self.api("label/__name__/values"))
