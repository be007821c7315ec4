"""The SQLite layer the file-backed stores share (the exact store, PLAID, WARP; the folder locks
also serve Milvus Lite and Qdrant Edge): the write lock a store takes for each write
(:func:`acquire_write_lock`; readers take none), the shared locks on index folders readers
answer from (:func:`share_directory`), read-only connections (:func:`connect_reader`), a WAL +
``synchronous=FULL`` connection with a key/value ``state`` table, one ``BEGIN IMMEDIATE``
transaction helper, and state reads/writes.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> db = connect(d / "s.sqlite")
>>> with transaction(db):
...     state_set(db, generation=3)
>>> state_get(db, "generation"), state_get(db, "missing", "0")
('3', '0')
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from uibk_embedding.errors import CollectionMismatch, StoreInUse


def lock_folder(lock_path: str | os.PathLike, what: str) -> IO[bytes]:
    """An exclusive, non-blocking lock on ``lock_path`` (kept until the returned file is closed);
    :class:`StoreInUse` naming ``what`` when another store object (of any class) or process
    holds it."""
    f = open(lock_path, "a+b")  # held for the store's lifetime
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise StoreInUse(f"{what} is open in another store object (this or another process); "
                         "close it first") from None
    return f


WRITE_TIMEOUT = 5.0
"""Seconds a write waits for the write lock of a store folder another store object holds (then
:class:`StoreInUse`); the file-backed stores' ``write_timeout`` default (SQLite's own is 5 s)."""


def acquire_write_lock(lock_path: str | os.PathLike, what: str, timeout: float = WRITE_TIMEOUT) -> IO[bytes]:
    """The write lock of a shared folder: an exclusive ``flock`` on ``lock_path`` (created when
    missing), waited for up to ``timeout`` seconds (polled: a ``flock`` cannot time out), kept
    until the returned file is closed. :class:`StoreInUse` naming ``what`` when another writer
    (another store object of this process, or another process) still holds it then. Readers
    never take this lock, so they neither wait for a writer nor hold one up.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> held = acquire_write_lock(d / "store.lock", "the store folder D")
    >>> try:
    ...     acquire_write_lock(d / "store.lock", "the store folder D", timeout=0)
    ... except StoreInUse as e:
    ...     print(e)  # doctest: +ELLIPSIS
    the store folder D is being written by another store object (this or another process) and ...
    >>> held.close()
    """
    f = open(lock_path, "a+b")
    deadline = time.monotonic() + max(0.0, timeout)
    pause = 0.002
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                raise StoreInUse(
                    f"{what} is being written by another store object (this or another process) and "
                    f"stayed so for {timeout:g} s: a store folder takes one writer at a time (readers "
                    "are never refused); close the other writer, or wait longer (write_timeout=)") from None
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.05)


def share_directory(path: str | os.PathLike, timeout: float = WRITE_TIMEOUT) -> int | None:
    """A shared ``flock`` on the directory ``path`` (its descriptor; ``os.close`` it to release):
    what a store object holds on the index folder it has loaded, so that no writer updates that
    folder in place or deletes it meanwhile (:func:`try_exclusive`). Waits up to ``timeout``
    seconds for a writer that holds it exclusively (an in-place update, a removal); ``None`` when
    the folder is gone or still held then. Works in a read-only folder (nothing is created)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.005)


def try_exclusive(fd: int) -> bool:
    """Turn the shared lock ``fd`` holds into an exclusive one if no other store object (of any
    process) shares it; False, with the shared lock held again, when one does."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        # the conversion may have dropped the shared lock (flock(2)): take it back; only readers
        # (shared holders) can be in the way, so this does not wait
        fcntl.flock(fd, fcntl.LOCK_SH)
        return False


def remove_unshared_directory(path: str | os.PathLike) -> bool:
    """Delete the directory ``path`` unless a store object shares it (:func:`share_directory`):
    taken exclusively first, so no reader loads it while it goes. Returns whether it went (or
    was gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a reader still answers from it: the next writer removes it
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.exists(path)
    finally:
        os.close(fd)


def writable_folder(path: str | os.PathLike) -> bool:
    """Whether this process may create files in ``path`` (SQLite's ``-wal``/``-shm`` files, a
    lock): ``os.access`` for write and search. A read-only mount, or a folder of another user
    made read-only (``chmod -R a-w``), is not; the superuser's checks pass wherever the file
    system itself takes writes."""
    return os.access(path, os.W_OK | os.X_OK)


def connect_reader(db_path: str | os.PathLike, writable: bool = True) -> sqlite3.Connection:
    """A read-only connection to a store database (autocommit; transactions explicit): SQLite's
    ``mode=ro``, which reads through the WAL (and so sees every committed write, and the changes
    of ``PRAGMA data_version``). In a folder this process cannot write (``writable`` False) the
    database is opened ``immutable=1`` instead: no lock, no ``-shm`` file, the WAL not read. A
    folder is meant to be made read-only after its writer closed (SQLite then folds the WAL into
    the database file); a WAL a killed writer left there is not seen."""
    uri = Path(db_path).resolve().as_uri()
    mode = "ro" if writable else "ro&immutable=1"
    return sqlite3.connect(f"{uri}?mode={mode}", uri=True, isolation_level=None, check_same_thread=False)


def lock_directory(path: str | os.PathLike, what: str) -> int:
    """:func:`lock_folder` on the directory itself (an ``flock`` on its descriptor, no file added
    to it): for folders that belong to an engine which allows no foreign files. Returns the
    descriptor; ``os.close`` it to release."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(f"{what} is open in another store object (this or another process); "
                         "close it first") from None
    return fd


def connect(db_path: str | os.PathLike, *schema: str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL and ``synchronous=FULL``,
    with the ``state`` table and the ``schema`` statements run."""
    db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    for statement in schema:
        db.execute(statement)
    db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    return db


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any exception, a failed ``COMMIT`` too."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        # also after a failed COMMIT (a full disk, an I/O error): left open, the transaction
        # would make every later write fail with "cannot start a transaction within a transaction"
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def read_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN`` ... ``COMMIT`` around reads: in WAL mode every statement inside sees the one
    committed state that was current at the first (a snapshot), whatever a writer commits meanwhile;
    a writer never waits for it."""
    db.execute("BEGIN")
    try:
        yield db
    finally:
        with contextlib.suppress(sqlite3.Error):
            db.execute("COMMIT")


def state_get(db: sqlite3.Connection, key: str, default: str | None = None) -> str | None:
    row = db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
    return row[0] if row else default


def stored_state(folder: str | os.PathLike, key: str, db_name: str = "store.sqlite") -> str | None:
    """One ``state`` value of the store database in ``folder``, read without opening the store
    (for tests and tools looking at a store another process wrote)."""
    db = sqlite3.connect(os.path.join(folder, db_name))
    try:
        return state_get(db, key)
    finally:
        db.close()


def state_set(db: sqlite3.Connection, **values: Any) -> None:
    db.executemany("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)",
                   [(k, str(v)) for k, v in values.items()])


def rename_state_keys(db: sqlite3.Connection, renamed: dict[str, str]) -> list[str]:
    """Rename the ``state`` keys ``old -> new`` of ``renamed`` that the database still has, all in
    one transaction (nothing is written when none is left); returns the old names renamed.

    >>> import tempfile, pathlib
    >>> db = connect(pathlib.Path(tempfile.mkdtemp()) / "s.sqlite")
    >>> with transaction(db):
    ...     state_set(db, plaid_dir="plaid-000002")
    >>> rename_state_keys(db, {"plaid_dir": "index_dir", "vf_rows": "vector_rows"})
    ['plaid_dir']
    >>> state_get(db, "index_dir"), state_get(db, "plaid_dir"), rename_state_keys(db, {"plaid_dir": "x"})
    ('plaid-000002', None, [])
    """
    marks = ",".join("?" * len(renamed))
    found = [r[0] for r in db.execute(f"SELECT key FROM state WHERE key IN ({marks})", list(renamed))]
    if found:
        with transaction(db):
            for old in found:
                db.execute("INSERT OR REPLACE INTO state (key, value) "
                           "SELECT ?, value FROM state WHERE key = ?", (renamed[old], old))
                db.execute("DELETE FROM state WHERE key = ?", (old,))
    return sorted(found)


def committed_generation(db: sqlite3.Connection, key: str) -> int | None:
    """The vector-file generation ``key`` the database names now (after a failed transaction:
    did it commit after all?); None when the database cannot be read, in which case no file it
    might name may be deleted."""
    try:
        return int(state_get(db, key, "1") or 1)
    except (sqlite3.Error, ValueError):
        return None


SQLITE_HEADER = b"SQLite format 3\x00"


def refuse_foreign_entries(folder: str | os.PathLike, what: str, ours: Callable[[list[str]], bool]) -> None:
    """:class:`CollectionMismatch` unless ``folder`` is missing, empty, or ``ours(names)`` says its
    entries are an engine's own layout: for the engines that make their files themselves (Qdrant
    local mode, LanceDB), checked before the engine creates anything in it.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "notes.txt").write_text("mine")
    4
    >>> refuse_foreign_entries(d, "a LanceDB database", lambda names: False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.CollectionMismatch: ... is not a LanceDB database and is not empty ...notes.txt...
    """
    folder = Path(folder)
    if not folder.exists():
        return
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None
    if names is None or (names and not ours(names)):
        held = "it is a file" if names is None else f"it holds {names[:5]}"
        raise CollectionMismatch(f"{folder} is not {what} and is not empty ({held}): give its own "
                                 "folder, or an empty or new one; nothing was written")


def sqlite_tables(db_path: str | os.PathLike) -> list[str] | None:
    """The table names of the SQLite file ``db_path`` (``[]`` for an empty file), read in
    ``immutable`` mode (no lock, no journal: nothing is created beside it); ``None`` when it is
    not a SQLite database or cannot be read."""
    with open(db_path, "rb") as f:
        head = f.read(len(SQLITE_HEADER))
    if not head:
        return []
    if head != SQLITE_HEADER:
        return None
    try:
        db = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            return sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        finally:
            db.close()
    except sqlite3.Error:
        return None


def _store_database_problem(db_path: Path, backend: str | None) -> str | None:
    """Why the file ``db_path`` is not the database of a ``backend`` store (None: it is one, or
    one whose creation died before its first table). Read without creating anything beside it:
    SQLite's ``immutable`` mode takes no lock and writes no journal, WAL or shared-memory file."""
    if not db_path.is_file():
        return "is not a file"
    with open(db_path, "rb") as f:
        head = f.read(len(SQLITE_HEADER))
    if not head:
        return None  # created, never written: a store whose creation died
    if head != SQLITE_HEADER:
        return "is not a SQLite database"
    try:
        db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            tables = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            config = state_get(db, "config") if "state" in tables else None
        finally:
            db.close()
    except sqlite3.Error:
        # damaged, or caught mid-checkpoint by the process that has the store open (an immutable
        # read takes no lock): undecided here; the lock and the real open say which
        return None
    if config is None:
        return f"holds tables {tables[:5]} but no configuration" if set(tables) - {"state"} else None
    try:
        found = json.loads(config).get("backend")
    except (ValueError, AttributeError):
        return "holds a configuration that is not a JSON object"
    if backend is not None and found != backend:
        return f"holds a store of backend {found!r}"
    return None


def refuse_foreign_folder(folder: str | os.PathLike, db_name: str, lock_name: str, what: str,
                          backend: str | None = None) -> None:
    """Refuse (:class:`CollectionMismatch`, naming the folder) a folder that is not a ``what``
    store's, before anything is created in it: a store only writes into, or cleans up, a folder
    that is empty (but for its lock) or holds its database ``db_name``: a SQLite file with a
    store configuration (of ``backend``, when given), or only an empty ``state`` table (a
    creation that died). Nothing in the folder is changed by the check.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> refuse_foreign_folder(d, "store.sqlite", "store.lock", "PLAID")  # empty: ours
    >>> _ = (d / "notes.txt").write_text("mine")
    >>> refuse_foreign_folder(d, "store.sqlite", "store.lock", "PLAID")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.CollectionMismatch: ... is not a PLAID store (no store.sqlite) and is not empty ...
    >>> sorted(p.name for p in d.iterdir())
    ['notes.txt']
    """
    folder = Path(folder)
    db_path = folder / db_name
    what = f"{'an' if what[:1].lower() in 'aeiou' else 'a'} {what}"
    if os.path.lexists(db_path):
        problem = _store_database_problem(db_path, backend)
        if problem is not None:
            raise CollectionMismatch(f"{folder} does not hold {what} store: its {db_name} {problem}; "
                                     "refusing to open it (give its store's folder, or an empty or new one)")
        return
    # our lock is an empty file: one with content is someone else's
    other = sorted(p.name for p in folder.iterdir()
                   if p.name != lock_name or not p.is_file() or p.stat().st_size)
    if other:
        raise CollectionMismatch(f"{folder} is not {what} store (no {db_name}) and is not empty "
                                 f"(it holds {other[:5]}): give an empty or new folder")


def remove_stale_index_dirs(folder: str | os.PathLike, prefix: str, current: str, generation: int) -> None:
    """Delete the index folders an engine store wrote and no longer uses: ``<prefix>NNNNNN`` of an
    earlier generation, or of the next one (a rebuild that crashed before its switch), never a
    folder of another name, nor one a reader still answers from (:func:`remove_unshared_directory`).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ("plaid-000001", "plaid-000002", "plaid-notes"): (d / name).mkdir()
    >>> remove_stale_index_dirs(d, "plaid-", current="plaid-000002", generation=2)
    >>> sorted(p.name for p in d.iterdir())
    ['plaid-000002', 'plaid-notes']
    """
    pattern = re.compile(rf"^{re.escape(prefix)}(\d{{6,}})$")
    for p in Path(folder).iterdir():
        m = pattern.match(p.name)
        if m and int(m.group(1)) <= int(generation) + 1 and p.is_dir() and p.name != current:
            remove_unshared_directory(p)
