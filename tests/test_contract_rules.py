"""The store contract's rules, enforced once in :mod:`uibk_embedding.adapters.base` and the same on
every local store: the reopen check (:func:`~uibk_embedding.adapters.base.record_problems`) refuses a
record of another writer, a schema this version does not read, an unreadable record or format and a
conflicting format, with :class:`CollectionMismatch` naming where the record is kept and what is
wrong, before anything in the store is changed (no PLAID schema conversion of a store that does not
fit). Each engine supplies only where it keeps its record: the file-backed stores' (exact, PLAID,
WARP) configuration row in ``store.sqlite`` (and a folder of 0.4's ``store.json``, checked before it
is converted), the Qdrant collection metadata, the Qdrant Edge shard's ``uibk_embedding.json``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uibk_embedding.adapters.base import check_record, read_record, record_problems
from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.errors import CollectionMismatch, StoreNotFound
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list
from uibk_embedding.testing.old_formats import write_exact_store_04

FMT = TaggedFormat()
OTHER = TaggedFormat(beta=0.8)


def _listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> its bytes), folders as ``b"<dir>"``."""
    return {str(p.relative_to(folder)): (b"<dir>" if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def _docs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, 6) for _ in range(n)]


# -- the one function --------------------------------------------------------------------------
HOLDS: dict[str, Any] = {"key": "backend", "value": "exact", "schema_key": "version", "schema": (1, 2)}
GOOD = {"backend": "exact", "version": 2, "format": FMT.to_stored()}


@pytest.mark.parametrize(("record", "requested", "problem"), [
    (None, None, "it holds no readable record of a 'exact' store"),
    ("{not json", None, "it holds no readable record"),
    ([GOOD], None, "it holds no readable record"),
    ({**GOOD, "backend": "warp"}, None, "its record names backend 'warp', not 'exact'"),
    ({**GOOD, "version": 3}, None, "its record has version 3; this version of uibk-embedding reads "
                                   "version 1 or 2"),
    ({k: v for k, v in GOOD.items() if k != "version"}, None, "its record has version None"),
    ({**GOOD, "format": {"beta": "high"}}, None, "unreadable format record"),
    ({k: v for k, v in GOOD.items() if k != "format"}, None, "unreadable format record ('format')"),
    (GOOD, OTHER, f"it holds lists of beta={FMT.beta}, lambda={FMT.lambda_}, not beta=0.8"),
], ids=["none", "not-json", "not-a-dict", "writer", "newer-schema", "no-schema", "bad-format",
        "no-format", "conflict"])
def test_record_problems_names_what_is_wrong(record, requested, problem):
    saved, problems = record_problems(record, requested, **HOLDS)
    assert saved is None or requested is not None  # a format only when the record is readable
    assert len(problems) == 1 and problem in problems[0], problems
    with pytest.raises(CollectionMismatch, match=r"^the record does not fit this store: .*left unchanged"):
        check_record(record, requested, "the record", **HOLDS)


def test_record_problems_accepts_a_fitting_or_an_absent_optional_record():
    assert record_problems(GOOD, None, **HOLDS) == (FMT, [])
    assert record_problems({**GOOD, "version": 1}, FMT, **HOLDS) == (FMT, [])
    assert check_record({**GOOD, "format": OTHER.to_stored()}, None, "x", **HOLDS) == OTHER
    assert record_problems(None, OTHER, **HOLDS, optional=True) == (None, [])
    # absent is not unreadable: a record that is there but not JSON is refused also when optional
    assert record_problems(read_record("{oops"), None, **HOLDS, optional=True)[1]
    assert record_problems(read_record(None), None, **HOLDS, optional=True) == (None, [])


# -- an exact store of 0.4: store.json, checked before the folder is converted -------------------
def _exact_store(path: Path) -> dict:
    write_exact_store_04(path, ["a", "b", "c", "d"], _docs(4), [{}] * 4)
    return json.loads((path / "store.json").read_text())


@pytest.mark.parametrize(("change", "problem"), [
    (lambda c: {**c, "backend": "qdrant-edge"}, "its record names backend 'qdrant-edge', not 'exact'"),
    (lambda c: {**c, "version": 9}, "its record has version 9"),
    (lambda c: {**c, "format": "beta"}, "unreadable format record"),
    (lambda c: "not json {", "it holds no readable record"),
], ids=["writer", "newer", "format", "not-json"])
def test_exact_store_with_a_record_that_does_not_fit_is_refused_untouched(tmp_path, change, problem):
    path = tmp_path / "s"
    config = change(_exact_store(path))
    (path / "store.json").write_text(config if isinstance(config, str) else json.dumps(config))
    before = _listing(path)
    with pytest.raises(CollectionMismatch) as err:
        ExactStore(path=path)
    assert problem in str(err.value) and f"{path} (its store.json)" in str(err.value)
    assert set(_listing(path)) - {"store.lock"} == set(before)  # only the lock the open took
    assert all(_listing(path)[name] == data for name, data in before.items())


def test_exact_store_of_version_1_still_opens(tmp_path):
    path = tmp_path / "s"
    config = _exact_store(path)
    (path / "store.json").write_text(json.dumps({**config, "version": 1}))
    with ExactStore(path=path) as s:
        assert s.count() == 3


# -- the engine stores: the configuration row in store.sqlite --------------------------------------
def _set_config(path: Path, change: Any) -> None:
    db = sqlite3.connect(path / "store.sqlite")
    with db:
        (raw,) = db.execute("SELECT value FROM state WHERE key = 'config'").fetchone()
        db.execute("UPDATE state SET value = ? WHERE key = 'config'", (json.dumps(change(json.loads(raw))),))
    db.close()


@pytest.mark.parametrize(("change", "problem"), [
    (lambda c: {**c, "schema": 7}, "its record has schema 7; this version of uibk-embedding reads schema"),
    (lambda c: {**c, "format": {"beta": []}}, "unreadable format record"),
], ids=["newer-schema", "format"])
@pytest.mark.parametrize("store", ["scan", "exact"])
def test_engine_store_with_a_record_that_does_not_fit_is_refused_untouched(tmp_path, change, problem, store):
    from uibk_embedding.adapters.indexed import ScanEngine

    make = ScanEngine if store == "scan" else (lambda p: ExactStore(path=p))
    path = tmp_path / "s"
    s = make(path)
    s.upsert(["a"], _docs(1))
    s.close()
    _set_config(path, change)
    before = _listing(path)
    with pytest.raises(CollectionMismatch) as err:
        make(path)
    assert problem in str(err.value) and f"{path} (the configuration in its store.sqlite)" in str(err.value)
    assert _listing(path) == before


def test_plaid_schema_1_store_that_does_not_fit_is_refused_before_it_is_converted(tmp_path):
    """A schema-1 PLAID store (vectors as SQLite blobs) opened with another format or other build
    parameters is refused and stays schema 1: the check runs before the conversion (which used to
    run first, rewriting the store that was then refused)."""
    pytest.importorskip("fast_plaid")
    import importlib.metadata

    from uibk_embedding.plaid_backend.store import BUILD_DEFAULTS, PlaidStore

    path = tmp_path / "p"
    path.mkdir()
    docs = _docs(3)
    config = {"backend": "plaid", "schema": 1, "format": FMT.to_stored(),
              "build": {**BUILD_DEFAULTS, "nbits": 2, "kmeans_niters": 1, "vector_dtype": "float16"},
              "engine": f"fast-plaid {importlib.metadata.version('fast-plaid')}"}
    db = sqlite3.connect(path / "store.sqlite")
    with db:
        db.execute("CREATE TABLE docs (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
                   "n_rows INTEGER NOT NULL, vectors BLOB NOT NULL, metadata TEXT NOT NULL)")
        db.execute("CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.executemany("INSERT INTO state VALUES (?, ?)", [("config", json.dumps(config)), ("plaid_dir", ""),
                                                          ("dirty", "0"), ("generation", "0")])
        db.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?)",
                       [(i + 1, f"d{i}", len(v), v.astype("float16").tobytes(), "{}")
                        for i, v in enumerate(docs)])
    db.close()
    before = _listing(path)
    for options, problem in (({"format": OTHER}, "not beta=0.8"), ({"nbits": 4}, "nbits=2, not 4")):
        with pytest.raises(CollectionMismatch, match=problem):
            PlaidStore(path, num_threads=1, **options)
        # no vector file, no renamed state keys (only the lock every open takes and leaves)
        assert set(_listing(path)) - {"store.lock"} == set(before)
        db = sqlite3.connect(path / "store.sqlite")
        state = dict(db.execute("SELECT key, value FROM state"))
        db.close()
        assert json.loads(state["config"])["schema"] == 1 and "plaid_dir" in state


# -- Qdrant: the collection metadata, and the Edge shard's record file ------------------------------
def test_qdrant_collection_record_is_checked_by_the_one_function():
    pytest.importorskip("qdrant_client")
    from qdrant_client import QdrantClient

    from uibk_embedding.adapters.qdrant import META_KEY, QdrantStore

    client = QdrantClient(location=":memory:")
    QdrantStore("c", client=client, format=OTHER).close()
    cases = [({"version": 2, "format": OTHER.to_stored()}, "its record has version 2"),
             ({"version": 1, "format": {"beta": "x"}}, "unreadable format record"),
             ("garbage", "it holds no readable record")]
    for n, (record, problem) in enumerate(cases):
        name = f"c{n}"
        QdrantStore(name, client=client).close()
        client.update_collection(name, metadata={META_KEY: record})
        with pytest.raises(CollectionMismatch, match=f"Qdrant collection '{name}' does not fit") as err:
            QdrantStore(name, client=client)
        assert problem in str(err.value)
    assert QdrantStore("c", client=client).format == OTHER


def test_edge_shard_record_is_checked_by_the_one_function(tmp_path):
    pytest.importorskip("qdrant_edge")
    from uibk_embedding.adapters.qdrant_edge import CONFIG_FILE, QdrantEdgeStore

    path = tmp_path / "shard"
    QdrantEdgeStore(path=path, format=OTHER).close()
    record = json.loads((path / CONFIG_FILE).read_text())
    for text, problem in (("{not json", "it holds no readable record"),
                          (json.dumps({**record, "version": 5}), "its record has version 5"),
                          (json.dumps({**record, "backend": "exact"}), "its record names backend 'exact'")):
        (path / CONFIG_FILE).write_text(text)
        with pytest.raises(CollectionMismatch, match=f"Edge shard at {path} does not fit") as err:
            QdrantEdgeStore(path=path)
        assert problem in str(err.value)
    (path / CONFIG_FILE).write_text(json.dumps(record))
    with QdrantEdgeStore(path=path) as s:
        assert s.format == OTHER
    (path / CONFIG_FILE).unlink()  # a creation that died before the record: accepted, nothing to check
    with QdrantEdgeStore(path=path, format=FMT) as s:
        assert s.format == FMT


# -- a read never creates ------------------------------------------------------------------------
def test_qdrant_local_create_false_creates_nothing(tmp_path):
    """``QdrantStore(path=..., create=False)`` on a folder without the collection is refused
    before qdrant-client makes the folder, its lock, its meta.json or our redo log (it used to
    leave all four); a collection that exists opens."""
    pytest.importorskip("qdrant_client")
    from uibk_embedding.adapters.qdrant import QdrantStore

    missing = tmp_path / "none"
    with pytest.raises(StoreNotFound, match=r"does not exist .*nothing was created"):
        QdrantStore("c", path=missing, create=False)
    assert not missing.exists()
    folder = tmp_path / "q"
    QdrantStore("c", path=folder).close()
    before = _listing(folder)
    with pytest.raises(StoreNotFound, match="'d' does not exist"):
        QdrantStore("d", path=folder, create=False)
    assert _listing(folder) == before
    with QdrantStore("c", path=folder, create=False) as s:
        assert s.count() == 0


# -- metadata limits every backend shares ------------------------------------------------------
# (what PostgreSQL's jsonb cannot hold: the exact store and others stored it, pgvector alone refused)
NUL_CASES = [({"k\x00": 1}, r"metadata\[1\]: the key 'k\\x00' holds a NUL character"),
             ({"s": "a\x00b"}, r"metadata\[1\]\['s'\] holds a NUL character"),
             ({"l": ["ok", "x\x00"]}, r"metadata\[1\]\['l'\]\[1\] holds a NUL character"),
             ({"d": {"e\x00": {"f": 2}}}, r"metadata\[1\]\['d'\]: the key 'e\\x00' holds a NUL character")]


def test_validate_metadata_refuses_a_nul_character_naming_where():
    from uibk_embedding.adapters.base import validate_metadata
    from uibk_embedding.errors import InvalidInput

    for md, where in NUL_CASES:
        with pytest.raises(InvalidInput, match=where):
            validate_metadata([{}, md], 2)
    # a backslash and "u0000" spelled out (JSON "\\u0000") is no NUL
    assert validate_metadata([{"s": "\\u0000"}], 1) == [{"s": "\\u0000"}]


def test_a_nul_character_in_metadata_is_refused_by_every_backend_before_anything_is_written(spec, tmp_path):
    from uibk_embedding.errors import InvalidInput
    from uibk_embedding.testing import open_spec

    store = open_spec(spec, tmp_path)
    try:
        good = _docs(2)
        store.upsert(["kept"], [good[0]], [{"s": "as before"}])
        for md, where in NUL_CASES:
            with pytest.raises(InvalidInput, match=where):
                store.upsert(["fresh", "x"], [good[1], good[1]], [{}, md])
            assert store.count() == 1
            assert [(x, m) for x, m in store.scan()] == [("kept", {"s": "as before"})]
    finally:
        store.close()
