"""A local, real Milvus standalone server for tests and development (not storage code).

:class:`LocalMilvusServer` runs the ``milvus run standalone`` binary of the ``milvus`` PyPI
package (2.3.x, the ``milvus-server`` extra) confined to this machine's loopback. The storage
adapter, :mod:`uibk_embedding.adapters.milvus`, knows nothing of it: it takes a URI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from uibk_embedding._optional import require
from uibk_embedding.testing.server_process import LocalServer, pid_alive, wait_for_ready


def user_namespaces_available() -> bool:
    """Whether ``unshare --user --map-root-user --net`` works here (confines a server to loopback)."""
    import subprocess

    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "--user", "--map-root-user", "--net", "true"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def shutdown_sockets(*socks: Any) -> None:
    """Shut each socket down both ways; one that is already closed or not connected is skipped.

    >>> import socket
    >>> a, b = socket.socketpair()
    >>> shutdown_sockets(a, b)
    >>> a.recv(1), b.recv(1)
    (b'', b'')
    >>> c = socket.socket(); c.close(); shutdown_sockets(c)   # closed: skipped
    >>> a.close(); b.close()
    """
    import socket

    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pump(a: Any, b: Any) -> None:
    """Copy bytes from socket ``a`` to ``b`` until either side closes, then shut both down."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        shutdown_sockets(a, b)


class LocalMilvusServer(LocalServer):
    """The real ``milvus run standalone`` server from the ``milvus`` PyPI package (2.3.x), local only.

    That binary listens on every interface whatever its config says, so it runs inside a private
    network namespace (``unshare``; no root needed) where only its own loopback exists; a relay
    forwards ``127.0.0.1:<free port>`` on this machine to it over a Unix socket. Data lives in a
    temporary directory removed on :meth:`stop`. The server ignores SIGTERM, so :meth:`stop` sends
    SIGTERM, waits ``grace`` seconds and then SIGKILLs it by pid. Startup takes several seconds.

    >>> from uibk_embedding.adapters.milvus import MilvusStore
    >>> with LocalMilvusServer() as server:  # doctest: +SKIP
    ...     store = MilvusStore(uri=server.uri)
    """

    def __init__(self, startup_timeout: float = 180.0, grace: float = 3.0) -> None:
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.uri = ""
        self.pid: int | None = None
        self._proc: Any = None
        self._base = ""
        self._listener: Any = None

    def start(self) -> str:
        import socket
        import subprocess
        import sys

        require("milvus", "milvus-server", "a local Milvus standalone server")
        if not user_namespaces_available():
            raise RuntimeError("cannot confine the Milvus server to 127.0.0.1: 'unshare --user --net' "
                               "(unprivileged user namespaces) is not available on this machine")
        self._base = tempfile.mkdtemp(prefix="uibk-milvus-standalone-")
        sock_path = os.path.join(self._base, "proxy.sock")
        log = open(os.path.join(self._base, "launcher.log"), "wb")
        cmd = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net",
               sys.executable, "-m", "uibk_embedding.testing._milvus_inner", self._base, sock_path, "1",
               str(os.getpid())]
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()
        ready = os.path.join(self._base, "ready")
        if not wait_for_ready(ready, self._proc, self.startup_timeout, 0.2):
            tail = open(os.path.join(self._base, "launcher.log"), errors="replace").read()[-2000:]
            self.stop()
            raise RuntimeError(f"the Milvus standalone server did not start:\n{tail}")
        self.pid = int(open(ready).read().split()[0])
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        threading.Thread(target=self._relay, args=(self._listener, sock_path), daemon=True).start()
        self.uri = f"http://127.0.0.1:{port}"
        return self.uri

    @staticmethod
    def _relay(listener: Any, sock_path: str) -> None:
        import socket

        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return  # listener closed: stop()
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                u.connect(sock_path)
            except OSError:
                c.close()
                continue
            threading.Thread(target=pump, args=(c, u), daemon=True).start()
            threading.Thread(target=pump, args=(u, c), daemon=True).start()

    def alive(self) -> bool:
        """Whether the server's process still runs (False before :meth:`start` and after :meth:`stop`)."""
        return self.pid is not None and pid_alive(self.pid)

    def keep_logs(self, tail: int = 1 << 20) -> str:
        """Copy the last ``tail`` bytes of the server's logs (the launcher's and Milvus's own) into
        a new temporary folder, which :meth:`stop` leaves in place; returns that folder."""
        out = tempfile.mkdtemp(prefix="uibk-milvus-logs-")
        logs = os.path.join(self._base, "data", "logs")
        names = sorted(os.listdir(logs)) if os.path.isdir(logs) else []
        for src in [os.path.join(self._base, "launcher.log"), *(os.path.join(logs, n) for n in names)]:
            with contextlib.suppress(OSError), open(src, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - tail))
                with open(os.path.join(out, os.path.basename(src)), "wb") as dst:
                    dst.write(f.read())
        return out

    def stop(self) -> None:
        """SIGTERM, ``grace`` seconds, then SIGKILL the server by pid; remove its data."""
        import signal

        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                deadline = time.monotonic() + self.grace
                while time.monotonic() < deadline:
                    os.kill(self.pid, 0)
                    if self._proc is not None and self._proc.poll() is not None:
                        break
                    time.sleep(0.1)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(timeout=30)
            self._proc = None
        if self._base:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = ""

    _shared: LocalMilvusServer | None = None
    _shared_lock = threading.Lock()

    _died_logs = ""

    @classmethod
    def shared(cls) -> LocalMilvusServer:
        """One server per process, started on first use and stopped when the process exits.

        A shared server whose process has died is not restarted: every later call raises a
        ``RuntimeError`` naming a folder with its logs (kept, as its data folder is not)."""
        import atexit

        with cls._shared_lock:
            if cls._shared is None:
                server = cls()
                server.start()
                atexit.register(server.stop)
                cls._shared = server
            elif not cls._shared.alive():
                if not cls._died_logs:
                    cls._died_logs = cls._shared.keep_logs()
                raise RuntimeError(f"the local Milvus standalone server of this process died; the last "
                                   f"of its logs are in {cls._died_logs}")
            return cls._shared
