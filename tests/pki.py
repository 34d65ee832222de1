"""A throwaway certificate authority for the TLS tests of every backend (``openssl``)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Pki:
    """A throwaway certificate authority with a server and a client certificate (PEM files)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def make_pki(directory: Path) -> Pki:
    """EC P-256 keys (quick to make); the server certificate is for 127.0.0.1 and localhost.
    With the extensions Python 3.13's strict
    verification (``VERIFY_X509_STRICT``, on by default) requires: the CA's key usage, each
    certificate's key identifiers. Keys are readable by their owner only (PostgreSQL insists)."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", d / "ca-key.pem", "-out", d / "ca.pem",
             "-days", "2", "-subj", "/CN=anarchon test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    ids = "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{name}.ext").write_text(ext + ids)
        _openssl("req", *ec, "-keyout", d / f"{name}-key.pem", "-out", d / f"{name}.csr",
                 "-subj", f"/CN=anarchon test {name}")  # fmt: skip
        _openssl("x509", "-req", "-in", d / f"{name}.csr", "-CA", d / "ca.pem",
                 "-CAkey", d / "ca-key.pem", "-CAcreateserial", "-out", d / f"{name}.pem",
                 "-days", "2", "-extfile", d / f"{name}.ext")  # fmt: skip
        (d / f"{name}-key.pem").chmod(0o600)
    return Pki(
        ca=d / "ca.pem",
        server_cert=d / "server.pem",
        server_key=d / "server-key.pem",
        client_cert=d / "client.pem",
        client_key=d / "client-key.pem",
    )
