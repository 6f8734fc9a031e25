"""PostgreSQL for the tests: the server CI started ($TUNER_TEST_POSTGRES_URL), or a throwaway cluster of
Debian's PostgreSQL started here; each test gets a database of its own on it.

Also a command line, for .ci/run: `python tests/postgres.py start DIR` starts a cluster in DIR and prints its
URL; `python tests/postgres.py stop DIR` stops it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

POSTGRES_URL_ENV = "TUNER_TEST_POSTGRES_URL"
POSTGRES_BINARIES = Path("/usr/lib/postgresql")
ROLE, DATABASE, ADMIN = "tuner", "tuner_test", "tuner_admin"


def _free_port() -> int:
    from tuner.workers.launch import free_port

    return free_port()


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin folder (Debian keeps each major version apart)."""
    found = sorted((p.parent for p in POSTGRES_BINARIES.glob("*/bin/initdb")), key=lambda p: int(p.parent.name))
    if not found:
        raise RuntimeError(f"no PostgreSQL under {POSTGRES_BINARIES}: install Debian's `postgresql` package, or set "
                           f"{POSTGRES_URL_ENV} to a server's URL")
    return found[-1]


def new_password() -> str:
    # Characters that must be percent-encoded in a URL: the password then exercises the quoting on every path.
    return f"pw-{secrets.token_hex(12)}/@:"


class PostgresCluster:
    """A PostgreSQL cluster of its own in `root`/data: 127.0.0.1 only, no Unix socket, password logins only.

    initdb refuses to run as root, so as root every server command runs as the `postgres` user."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = port
        self.bin = postgres_bin()

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args[:2])} failed: {(result.stderr or result.stdout).strip()}\n{log}")

    def create(self) -> str:
        """initdb, start, and a role with a password owning one database; returns that database's URL."""
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        admin_password, password = new_password(), new_password()
        pwfile = self.root / "admin-password"
        pwfile.write_text(admin_password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        try:
            self._run("initdb", "-D", str(self.data), "-U", ADMIN, f"--pwfile={pwfile}", "--auth=scram-sha-256",
                      "-E", "UTF8", "--no-instructions")
        finally:
            pwfile.unlink()
        self.start()
        admin = URL.create("postgresql+psycopg", ADMIN, admin_password, "127.0.0.1", self.port, "postgres")
        engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                # CREATEDB: each test creates a database of its own. The statement takes no bound parameters;
                # the generated password holds no quote.
                conn.exec_driver_sql(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{password}'")
                conn.exec_driver_sql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        finally:
            engine.dispose()
        return URL.create("postgresql+psycopg", ROLE, password, "127.0.0.1", self.port,
                          DATABASE).render_as_string(hide_password=False)

    def start(self) -> None:
        self.port = self.port or _free_port()
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories=''"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server if it runs (`immediate` is a crash, as far as its clients can tell)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    @classmethod
    @contextmanager
    def throwaway(cls) -> Iterator[tuple[PostgresCluster, str]]:
        """A cluster in a fresh folder (under /tmp, which the postgres user can reach), removed afterwards."""
        cluster = cls(Path(tempfile.mkdtemp(prefix="tuner-postgres-")))
        try:
            yield cluster, cluster.create()
        finally:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)


def _check_reachable(url: str) -> None:
    from tuner.storage import redact_url

    engine = sa.create_engine(url)
    try:
        with engine.connect():
            return
    except sa.exc.OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0]
    finally:
        engine.dispose()
    pytest.fail(f"{POSTGRES_URL_ENV}={redact_url(url)} cannot be reached: {reason}", pytrace=False)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL with a password: $TUNER_TEST_POSTGRES_URL, else a cluster started for this session.
    Without either the tests fail: they are never skipped."""
    url = os.environ.get(POSTGRES_URL_ENV)
    if url:
        _check_reachable(url)
        yield url
        return
    try:
        postgres_bin()
        missing = None
    except RuntimeError as exc:
        missing = str(exc)
    if missing:
        pytest.fail(f"no PostgreSQL for the tests: {missing}", pytrace=False)
    with PostgresCluster.throwaway() as (_, url):
        yield url


@contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server, dropped afterwards; yields its URL."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    engine = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        engine.dispose()


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[str]:
    """The URL of a database of this test's own."""
    with fresh_database(postgres_url) as url:
        yield url


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: postgres.py start|stop DIR", file=sys.stderr)
        return 2
    cluster = PostgresCluster(Path(argv[1]))
    if argv[0] == "start":
        print(cluster.create())
    else:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tuner.workers.launch, run as a script
    sys.exit(main(sys.argv[1:]))
