"""Operator-mode credentials for a test server: an operator, a system account, an application
account with JetStream, a user, their JWTs signed with nkeys, and the user's ``.creds`` file.

What ``nsc`` would write, made in the test so that nothing is fetched or kept.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]

NO_LIMITS = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
             "wildcards": True, "conn": -1, "leaf": -1}  # fmt: skip
JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def keypair(prefix: int) -> nkeys.KeyPair:
    """A fresh nkey pair of the kind ``prefix`` names (operator, account, user)."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def public(kp: nkeys.KeyPair) -> str:
    key: bytes = kp.public_key
    return key.decode()


def jwt(issuer: nkeys.KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS JWT (ed25519-nkey) for ``subject``, signed by ``issuer``."""
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": public(issuer),
        "name": name,
        "sub": subject,
        "nats": nats,
    }
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signed = f"{header}.{_b64(json.dumps(claims).encode())}"
    return f"{signed}.{_b64(issuer.sign(signed.encode()))}"


@dataclass
class Operator:
    """The server's configuration block and a user's ``.creds`` file."""

    config: str
    creds: Path
    stranger_creds: Path
    """Credentials of a user signed by an account the server does not know."""


def creds_text(user: nkeys.KeyPair, user_jwt: str) -> str:
    seed: bytes = user.seed
    return (
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n"
    )


def make_operator(directory: Path) -> Operator:
    """Keys, JWTs and files under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    operator = keypair(nkeys.PREFIX_BYTE_OPERATOR)
    system = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    account = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    stranger = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user_nats = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user",
                 "version": 2}  # fmt: skip
    op_jwt = jwt(operator, public(operator), "test-operator", {"type": "operator", "version": 2})
    sys_jwt = jwt(operator, public(system), "SYS",
                  {"limits": NO_LIMITS, "type": "account", "version": 2})  # fmt: skip
    app_limits = {**NO_LIMITS, **JETSTREAM}
    app_jwt = jwt(operator, public(account), "APP",
                  {"limits": app_limits, "type": "account", "version": 2})  # fmt: skip
    files: list[Path] = []
    for name, signer in (("app", account), ("stranger", stranger)):
        user = keypair(nkeys.PREFIX_BYTE_USER)
        path = directory / f"{name}.creds"
        path.write_text(creds_text(user, jwt(signer, public(user), name, user_nats)))
        files.append(path)
    config = (
        f'operator: "{op_jwt}"\n'
        f"system_account: {public(system)}\n"
        "resolver: MEMORY\n"
        "resolver_preload: {\n"
        f'  {public(system)}: "{sys_jwt}"\n'
        f'  {public(account)}: "{app_jwt}"\n'
        "}\n"
    )
    return Operator(config=config, creds=files[0], stranger_creds=files[1])
