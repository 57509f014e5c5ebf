"""How the embedded Postgres is locked: a random superuser password, required on every connection.

Postgres listens on loopback only, but sandboxes may share the host's network, and its
superuser can run host commands (`COPY ... TO PROGRAM`), so `trust` is no option. The
password lives in `PASSWORD_FILE` inside the data directory (mode 0600, the owner's alone);
the server only ever sees its SCRAM verifier, so no log line or failed statement can show it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

from suzumio.platform.embedded.credentials import secret_in

PASSWORD_FILE = "suzumio-password"  # noqa: S105 - a file name
SCRAM_ITERATIONS = 4096  # Postgres's own default for scram_iterations

HBA = """\
# Written by Suzumio. Every connection proves the superuser's password (scram-sha-256); it is
# in suzumio-password beside this file. The server has no Unix socket, so only the host lines
# are reached; the local ones are here so that enabling a socket adds no way in.
local   all           all                  scram-sha-256
host    all           all   127.0.0.1/32   scram-sha-256
host    all           all   ::1/128        scram-sha-256
local   replication   all                  scram-sha-256
host    replication   all   127.0.0.1/32   scram-sha-256
host    replication   all   ::1/128        scram-sha-256
"""


def password(pgdata: Path) -> str:
    """The superuser's password for `pgdata`, made on first use."""
    return secret_in(pgdata / PASSWORD_FILE)


def needs_locking(pgdata: Path) -> bool:
    """Whether `pgdata` still lets someone in without the password (an earlier version used
    `--auth=trust`), or its password was never made or is lost. Ask before `password` makes
    one: a file lost, or left empty by a crash, gets a new password the server must be told."""
    try:
        if not (pgdata / PASSWORD_FILE).read_text().strip():
            return True
    except FileNotFoundError:
        return True
    for line in (pgdata / "pg_hba.conf").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields and "scram-sha-256" not in fields:
            return True  # trust above all, but also peer, md5, ...: only our password will do
    return False


def write_hba(pgdata: Path) -> None:
    """Replace pg_hba.conf, keeping its owner (under root that is the server's account)."""
    hba = pgdata / "pg_hba.conf"
    owner = hba.stat()
    scratch = hba.with_name(".pg_hba.conf.tmp")
    scratch.write_text(HBA)
    scratch.chmod(0o600)
    os.chown(scratch, owner.st_uid, owner.st_gid)
    scratch.replace(hba)


def alter_password_sql(role: str, secret: str) -> str:
    return f"ALTER ROLE \"{role}\" PASSWORD '{scram_verifier(secret)}';\n"


def scram_verifier(secret: str, salt: bytes | None = None) -> str:
    """What Postgres stores for `secret` (RFC 5802/7677), so the plaintext never reaches it.

    The secrets we make are ASCII, for which SASLprep changes nothing.
    """
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    encoded = [base64.b64encode(part).decode() for part in (salt, stored_key, server_key)]
    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{encoded[0]}${encoded[1]}:{encoded[2]}"
