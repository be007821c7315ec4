"""What the local test servers (:mod:`~uibk_embedding.testing.milvus_server`,
:mod:`~uibk_embedding.testing.pg_server`) share: a launcher process that writes a *ready* file
once its server listens, and the ``with`` form of start / stop.
"""

from __future__ import annotations

import os
import time
from typing import Any, Self


def wait_for_ready(ready: str | os.PathLike, proc: Any, timeout: float, interval: float) -> bool:
    """Wait until the file ``ready`` exists: True then; False as soon as the launcher ``proc`` (a
    ``subprocess.Popen``) has exited or ``timeout`` seconds have passed without it.

    >>> import subprocess, sys, tempfile, pathlib
    >>> ready = pathlib.Path(tempfile.mkdtemp()) / "ready"
    >>> quits = subprocess.Popen([sys.executable, "-c", "pass"])
    >>> wait_for_ready(ready, quits, timeout=60, interval=0.05)
    False
    >>> serves = subprocess.Popen([sys.executable, "-c",
    ...                            f"import time; open({str(ready)!r}, 'w').close(); time.sleep(60)"])
    >>> wait_for_ready(ready, serves, timeout=60, interval=0.05)
    True
    >>> serves.kill(); serves.wait() != 0
    True
    """
    deadline = time.monotonic() + timeout
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts).

    >>> pid_alive(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalServer:
    """A server of its own process: :meth:`start` it, :meth:`stop` it, or use it in ``with``.

    >>> class Noisy(LocalServer):
    ...     def start(self): print("start")
    ...     def stop(self): print("stop")
    >>> with Noisy() as server:
    ...     type(server).__name__
    start
    'Noisy'
    stop
    """

    def start(self) -> str:
        """Start the server; its address."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server and remove its data."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
