"""Encode and index a corpus on a Ray cluster, straight into a store many processes can write to.

:func:`index_distributed` runs Ray Data's ``map_batches`` with a callable class: a fixed pool of
actors (``workers``, one per GPU when ``num_gpus=1``), each holding ONE encoder (a model loaded in
the actor, or clients of ``uibk-embed serve`` servers given by ``encoder_urls``) and ONE store
connection. Rows are checked before they reach the actors (a bad one is marked, not dropped);
each actor encodes its batch (the encoder sorts the batch by length
into padded sub-batches, docs/model.md "The encoding pipeline") and upserts the vectors itself:
vectors never travel back to the driver, only one small row of counters per batch, from which the
driver draws its progress (documents done / total, documents/s). Ray schedules; there is no scheduler here.

Exactly once, under retries
    Upserts overwrite by id (Qdrant points, Milvus write versions, LanceDB ``merge_insert``), so
    a batch that Ray runs again after its actor died writes the same ids again: no duplicate, no
    gap. The actors are created with ``max_restarts=retries`` and ``max_task_retries=retries``
    (Ray Data's own default is unbounded; a batch that kills its actor every time would then
    loop forever).
    ``resume=True`` lists the ids already stored (``store.scan()``) and the actors skip them
    before encoding.

Bad input
    A row that fails :func:`~uibk_embedding.apps.data.check_document` (its id, text, title or
    metadata: e.g. an empty text, a non-string id, metadata past a store limit) is not encoded;
    every other row is. At the end the run raises
    :class:`BadDocuments` listing each bad row's id, position (``FILE:LINE`` for JSONL, the list
    index, or ``position_column``) and reason, or, with ``skip_bad=True``, returns them in
    :attr:`DistributedResult.bad`.

Stores: a server that several processes write to: ``qdrant`` with ``url=``, ``milvus`` with an
``http(s)://`` ``uri=``, ``weaviate``, ``pgvector`` with ``dsn=``; or ``lancedb`` with ``uri=``
(or ``path=``), a folder every worker reaches (local disk for a one-machine cluster, a shared
file system or ``s3://...`` for several machines): LanceDB's commits retry on conflict, so
actors writing one table at once each keep their rows. In-process and single-writer
stores (``exact``, ``plaid``, ``warp``, ``qdrant-edge``, ``milvus-lite``, Qdrant local mode) are
refused with the reason.

Example (needs a Milvus server; ``ray.init()`` starts a local cluster when none is running)::

    from uibk_embedding.apps.distributed import index_distributed
    result = index_distributed("../shared/datasets/cranfield", "milvus",
                               {"uri": "http://127.0.0.1:19530", "collection": "cranfield"},
                               workers=2)
    print(result.indexed, result.docs_per_s)

>>> check_backend("exact", {})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: backend 'exact' lives inside one process; Ray workers need a server ...
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from uibk_embedding._optional import require
from uibk_embedding.adapters import open_store
from uibk_embedding.adapters.base import check_positive
from uibk_embedding.adapters.indexing import upsert_batches
from uibk_embedding.apps.data import BadDocument, Document, check_document, corpus_file, scan_corpus
from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.remote import RemoteEncoder
from uibk_embedding.errors import DataError
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.token_pooling import check_pool_factor, check_pool_factor_value, same_pooling_but_ids

SHARED_BACKENDS = ("qdrant", "milvus", "weaviate", "pgvector", "lancedb")
_COLUMNS = ("_id", "_text", "_title", "_body", "_meta", "_pos", "_error")


def _ray() -> Any:
    return require("ray", "ray", "distributed indexing (uibk_embedding.apps.distributed)")


class BadDocuments(DataError):
    """Rows that could not be encoded; every other row was indexed. ``bad`` lists them.

    >>> e = BadDocuments([BadDocument("d7", 3, "text must be a string, got int")], indexed=9)
    >>> isinstance(e, ValueError), str(e).split(":")[0]
    (True, '1 document(s) could not be indexed (9 others were)')
    """

    def __init__(self, bad: list[BadDocument], indexed: int) -> None:
        self.bad = bad
        self.indexed = indexed
        more = f"; ... ({len(bad) - 20} more)" if len(bad) > 20 else ""
        shown = "; ".join(str(b) for b in bad[:20]) + more
        super().__init__(f"{len(bad)} document(s) could not be indexed ({indexed} others were): {shown}. "
                         "Fix them, or pass skip_bad=True (--skip-bad) to leave them out.")


@dataclass
class DistributedResult:
    """What a distributed run did.

    ``total``: rows in the input; ``indexed``: rows upserted by this run; ``encoded``: texts the
    encoders were given (0 on a resumed run that found everything stored); ``skipped_existing``:
    rows left out because ``resume=True`` found them stored; ``bad``: rows not indexed (see
    :class:`BadDocuments`); ``seconds``: wall time of the pipeline (Ray startup excluded);
    ``worker_pids``: the processes that finished batches (a restarted actor adds one);
    ``encode_seconds`` / ``upsert_seconds``: summed over actors.

    >>> DistributedResult(total=10, indexed=8, skipped_existing=2, seconds=4.0).docs_per_s
    2.5
    """

    total: int
    indexed: int = 0
    encoded: int = 0
    skipped_existing: int = 0
    bad: list[BadDocument] = field(default_factory=list)
    batches: int = 0
    seconds: float = 0.0
    worker_pids: list[int] = field(default_factory=list)
    encode_seconds: float = 0.0
    upsert_seconds: float = 0.0

    @property
    def docs_per_s(self) -> float:
        """Documents handled (indexed + skipped) per second of pipeline wall time."""
        return (self.indexed + self.skipped_existing) / self.seconds if self.seconds > 0 else 0.0


def check_backend(backend: str, options: Mapping[str, Any]) -> None:
    """Refuse stores that Ray workers in other processes cannot share (raises ``ValueError``)."""
    if backend not in SHARED_BACKENDS:
        raise ValueError(
            f"backend {backend!r} lives inside one process; Ray workers need a server several "
            "processes can write to: qdrant (url=...), milvus (uri=http://...), weaviate, "
            "pgvector (dsn=...) or lancedb (uri=a folder every worker reaches)")
    if backend == "qdrant" and not options.get("url") and not options.get("host"):
        raise ValueError("backend 'qdrant' needs url=http://host:6333 for Ray workers (local mode, "
                         "location=/path=, is one process only)")
    if backend == "milvus" and not str(options.get("uri", "http://localhost:19530")).startswith(
            ("http://", "https://", "tcp://", "grpc://")):
        raise ValueError("backend 'milvus' needs a server uri=http://host:19530 for Ray workers "
                         "(a Milvus Lite *.db file is one process only)")
    if backend == "pgvector" and not options.get("dsn"):
        raise ValueError("backend 'pgvector' needs dsn=... for Ray workers (each opens its own "
                         "connection; a connection= object lives in one process)")
    if backend == "lancedb" and not (options.get("uri") or options.get("path")):
        raise ValueError("backend 'lancedb' needs uri=... (a folder or s3://... every Ray worker "
                         "reaches) for Ray workers (without it each opens its own temporary database)")


# -- input ------------------------------------------------------------------------------------
def _row(doc_id: Any, text: Any, title: Any, meta: Any, pos: Any) -> dict[str, Any]:
    """One normalised input row; ``_error`` says what is wrong with it ("": nothing)."""
    if isinstance(meta, str):  # a JSON text column (Parquet, a Ray Dataset)
        try:
            meta = json.loads(meta)
        except ValueError:
            pass  # not JSON: check_document refuses it as not an object
    return _as_row(check_document(doc_id, text, title, meta, pos), pos)


def _as_row(item: Document | BadDocument, pos: Any) -> dict[str, Any]:
    """A checked row in the columns the actors read."""
    if isinstance(item, BadDocument):
        doc_id = item.id
        return {"_id": "" if doc_id is None else str(doc_id), "_text": "", "_title": "", "_body": "",
                "_meta": "{}", "_pos": str(pos), "_error": item.reason}
    return {"_id": item.id, "_text": item.full_text, "_title": item.title, "_body": item.text,
            "_meta": json.dumps(item.metadata, ensure_ascii=False, allow_nan=False), "_pos": str(pos),
            "_error": ""}


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a BEIR folder (``corpus.jsonl``) or a JSONL file, bad rows kept and marked.

    The one corpus reader (:func:`uibk_embedding.apps.data.scan_corpus`, the rules of
    :func:`~uibk_embedding.apps.data.check_document`); where :func:`~uibk_embedding.apps.data.read_corpus`
    refuses the file at a bad row, this keeps the row (marked, so the run can report it with
    its line number) and indexes the others. Malformed JSON and duplicate ids still raise
    :class:`DataError`.

    >>> import json, pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "docs.jsonl"
    >>> rows = [{"_id": "a", "text": "wing"}, {"_id": "b", "text": 4}]
    >>> _ = p.write_text(chr(10).join(json.dumps(r) for r in rows))
    >>> [(r["_id"], r["_pos"], r["_error"]) for r in read_rows(p)]
    [('a', 'docs.jsonl:1', ''), ('b', 'docs.jsonl:2', 'text must be a string, got int')]
    """
    p = corpus_file(path)
    return [_as_row(item, f"{p.name}:{n}") for n, item in scan_corpus(p)]


def _items_rows(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of a list of documents; a duplicate id is a :class:`DataError`, as in a JSONL file."""
    out: list[dict[str, Any]] = []
    first: dict[str, int] = {}
    for i, it in enumerate(items):
        if isinstance(it, Document):
            out.append(_row(it.id, it.text, it.title, it.metadata, i))
        elif isinstance(it, Mapping):
            out.append(_row(it.get("_id", it.get("id")), it.get("text"), it.get("title"),
                            it.get("metadata"), i))
        else:
            raise TypeError(f"items[{i}]: expected a Document or a dict, got {type(it).__name__}")
        doc_id = out[-1]["_id"]
        if doc_id and not out[-1]["_error"] and first.setdefault(doc_id, i) != i:
            raise DataError(f"items[{i}]: duplicate document id {doc_id!r} (also items[{first[doc_id]}])")
    return out


def _from_arrow(value: Any, typ: Any) -> Any:
    """One Arrow value (``to_pylist``) as the JSONL reader would have it: a struct field that is
    null is left out. One Arrow schema covers every row, so a struct column holds every key of
    every row, null where a row had none: Arrow cannot tell such a key from one a row set to
    null, and both are dropped (a JSON text column keeps a real null)."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_struct(typ):
        return {f.name: _from_arrow(value[f.name], f.type) for f in typ if value.get(f.name) is not None}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return [_from_arrow(x, typ.value_type) for x in value]
    return value


def _column(batch: Any, col: str | None) -> list[Any] | None:
    """A column of an Arrow batch as plain Python values (ints stay ints, nulls None), or None."""
    if col is None or col not in batch.column_names:
        return None
    import pyarrow as pa

    column = batch.column(col)
    values = column.to_pylist()
    if pa.types.is_nested(column.type):
        values = [_from_arrow(v, column.type) for v in values]
    return values


def _normalise_batch(batch: Any, id_column: str, text_column: str,
                     title_column: str | None, metadata_column: str | None,
                     position_column: str | None) -> Any:
    """A user Dataset's batch (a ``pyarrow.Table``) -> the normalised columns; an id seen earlier
    in the batch is a bad row (one upsert call takes an id once).

    Read as Arrow, not numpy: numpy turned an int column with a null into floats (every id "1.0")
    and an int64 past 2**53 into a rounded float.
    """
    import pyarrow as pa

    names = batch.column_names
    if id_column not in names:  # to_dataset checks the schema first; a batch may still differ
        raise DataError(f"the input has no id column {id_column!r} (its columns: {sorted(names)})")
    cols: dict[str, list] = {c: [] for c in _COLUMNS}
    ids, texts, titles, metas, positions = (_column(batch, c) for c in (
        id_column, text_column, title_column, metadata_column, position_column))

    seen: set[str] = set()
    for i in range(batch.num_rows):
        pos = None if positions is None else positions[i]
        r = _row(ids[i], None if texts is None else texts[i], None if titles is None else titles[i],
                 None if metas is None else metas[i], pos)
        if not r["_error"] and r["_id"] in seen:
            r = _as_row(BadDocument(r["_id"], pos, "duplicate document id (an earlier row of its "
                                    "batch has it)"), pos)
        seen.add(r["_id"])
        for c in _COLUMNS:
            cols[c].append(r[c])
    return pa.table({c: pa.array(v, pa.string()) for c, v in cols.items()})


def to_dataset(data: Any, *, batch_size: int, id_column: str = "_id", text_column: str = "text",
               title_column: str | None = "title", metadata_column: str | None = "metadata",
               position_column: str | None = None) -> tuple[Any, int | None]:
    """A Ray Dataset of normalised rows and its size (None when unknown without running it).

    ``data``: a Ray Dataset; a BEIR folder or JSONL file; a Parquet file, a folder of Parquet
    files or a list of them; or a list of :class:`~uibk_embedding.apps.data.Document` / dicts.
    """
    _ray()
    import ray.data

    def from_rows(rows: list[dict]) -> tuple[Any, int]:
        blocks = max(1, -(-len(rows) // batch_size))
        return ray.data.from_items(rows, override_num_blocks=blocks), len(rows)

    if isinstance(data, ray.data.Dataset):
        ds, total = data, None
    elif isinstance(data, str | os.PathLike) or (
            isinstance(data, list | tuple) and data and all(isinstance(x, str | os.PathLike) for x in data)):
        paths = [Path(x) for x in (data if isinstance(data, list | tuple) else [data])]
        parquet = all(p.suffix == ".parquet" or (p.is_dir() and any(p.glob("*.parquet"))
                                                 and not (p / "corpus.jsonl").exists()) for p in paths)
        if parquet:
            ds, total = _read_parquet([str(p) for p in paths]), None
        elif len(paths) == 1:
            return from_rows(read_rows(paths[0]))
        else:
            raise DataError(f"expected one BEIR folder or JSONL file, or Parquet files; got {paths}")
    elif isinstance(data, list | tuple):
        return from_rows(_items_rows(data))
    else:
        raise TypeError(f"cannot index {type(data).__name__}: give a Ray Dataset, a path or a list")
    schema = ds.schema()  # None: an empty Dataset, which has nothing to check
    names = set(schema.names) if schema is not None else {id_column, text_column}
    if id_column == "_id" and "_id" not in names and "id" in names:
        id_column = "id"  # as a JSONL row may name it
    missing = [c for c in (id_column, text_column) if c not in names]
    if missing:
        raise DataError(f"the input has no {' or '.join(map(repr, missing))} column (its columns: "
                        f"{sorted(names)}); name yours with id_column= / text_column=")
    # num_cpus=0 (as the Parquet reads): a row check is light next to encoding, and a task that
    # asks for a CPU waits forever behind actors that hold every CPU
    ds = ds.map_batches(_normalise_batch, batch_format="pyarrow", batch_size=batch_size, num_cpus=0,
                        concurrency=_task_cap(),
                        fn_kwargs={"id_column": id_column, "text_column": text_column,
                                   "title_column": title_column, "metadata_column": metadata_column,
                                   "position_column": position_column})
    return ds, total


def _task_cap() -> int | None:
    """At most as many CPU-free read / row-check tasks at once as the cluster has CPUs (a task
    that asks for no CPU is not held back by Ray's CPU count)."""
    ray = _ray()
    return max(1, int(ray.cluster_resources().get("CPU", 1))) if ray.is_initialized() else None


def _read_parquet(paths: list[str]) -> Any:
    """``ray.data.read_parquet`` whose steps ask for no CPU, so that actors holding every CPU of
    the cluster cannot starve them (the run waited forever). Ray Data's newer Parquet reader
    (``use_datasource_v2``) lists the files in a task of one CPU that no argument changes; the
    older one lists them here, on the driver, and its read tasks take ``num_cpus``."""
    import ray.data
    from ray.data import DataContext

    ctx = DataContext.get_current()
    v2 = getattr(ctx, "use_datasource_v2", None)
    if v2:
        ctx.use_datasource_v2 = False
    try:
        return ray.data.read_parquet(paths, num_cpus=0, concurrency=_task_cap())
    finally:
        if v2:
            ctx.use_datasource_v2 = v2


# -- the actor ----------------------------------------------------------------------------------
EncoderSpec = str | os.PathLike | Callable[[], Any] | None


class IndexWorker:
    """One Ray actor of the pool: one encoder, one store connection; encodes and upserts batches.

    Ray Data builds it with ``fn_constructor_kwargs`` and calls it once per batch; it returns one
    row of counters per batch (never vectors). Usable directly, without Ray, on one process:

    >>> w = IndexWorker("milvus", {"uri": "http://127.0.0.1:9"})  # doctest: +SKIP
    """

    def __init__(self, backend: str, store_options: Mapping[str, Any], encoder: EncoderSpec = None,
                 encoder_options: Mapping[str, Any] | None = None,
                 encoder_urls: Sequence[str] | None = None, skip: Sequence[Any] | None = None,
                 store_text: bool = True, upsert_batch: int = 64, threads: int | None = None) -> None:
        self.gpu = False
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        if encoder_urls:
            self.encoders = [RemoteEncoder(u) for u in encoder_urls]
            self._next = random.randrange(len(self.encoders))  # spread actors over the servers
        else:
            options = dict(encoder_options or {})
            try:
                import ray

                self.gpu = bool(ray.get_gpu_ids())
            except Exception:
                pass
            if self.gpu:
                options.setdefault("device", "cuda")
            if callable(encoder):
                self.encoders = [encoder()]
            else:
                self.encoders = [load_encoder(encoder, **options)]
            self._next = 0
        fmts = {e.format for e in self.encoders}
        if len(fmts) > 1:
            raise ValueError(f"the encoder servers make different lists ({sorted(map(str, fmts))}); "
                             "give servers of one model and projection")
        self.store = open_store(backend, format=self.encoders[0].format, **dict(store_options))
        for e in self.encoders:  # a store keeps the frequent token ids of its first corpus
            if hasattr(e, "adopt_pooling") and same_pooling_but_ids(self.store.format, e.format):
                e.adopt_pooling(self.store.format)
        try:  # the driver checked it; a store changed since is refused here, before any write
            check_pool_factor(self.store.format, self.encoders[0].format, f"the {backend} store")
        except Exception:
            self.store.close()
            raise
        self.skip: frozenset = frozenset()
        if skip:
            ref = skip[0]
            self.skip = _ray().get(ref) if type(ref).__name__ == "ObjectRef" else frozenset(skip)
        self.store_text = store_text
        self.upsert_batch = max(1, int(upsert_batch))

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list]:
        ids = [str(x) for x in batch["_id"]]
        errors = [e if isinstance(e, str) else "" for e in batch["_error"]]
        bad = [{"id": x or None, "position": p, "reason": e}
               for x, p, e in zip(ids, batch["_pos"], errors, strict=True) if e]
        todo = [i for i, e in enumerate(errors) if not e and ids[i] not in self.skip]
        skipped = sum(1 for i, e in enumerate(errors) if not e and ids[i] in self.skip)
        t0 = time.perf_counter()
        vecs = []
        if todo:
            enc = self.encoders[self._next % len(self.encoders)]
            self._next += 1
            vecs = enc.encode_documents([str(batch["_text"][i]) for i in todo], show_progress=False)
        t1 = time.perf_counter()
        md = [Document(ids[i], str(batch["_body"][i]), str(batch["_title"][i]),
                       json.loads(batch["_meta"][i])).stored_metadata(self.store_text) for i in todo]
        upsert_batches(self.store, [ids[i] for i in todo], md, vectors=vecs, batch_size=self.upsert_batch)
        t2 = time.perf_counter()
        return {"indexed": [len(todo)], "encoded": [len(todo)], "skipped": [skipped],
                "rows": [len(ids)], "bad": [json.dumps(bad)], "pid": [os.getpid()],
                "encode_s": [t1 - t0], "upsert_s": [t2 - t1]}

    def __del__(self) -> None:
        try:
            self.store.close()
        except Exception:
            pass


# -- the driver ----------------------------------------------------------------------------------
def init_ray(address: str | None = None, **options: Any) -> bool:
    """Connect to the Ray cluster at ``address`` (None: a running one, else a new local one).

    Returns True when this call started Ray (the caller then shuts it down). Ray's own
    dashboard is off unless asked for.

    >>> init_ray(num_cpus=1, object_store_memory=100 * 2**20)  # doctest: +SKIP
    True
    """
    ray = _ray()
    if ray.is_initialized():
        return False
    options.setdefault("include_dashboard", False)
    options.setdefault("log_to_driver", True)
    if address:
        for k in ("num_cpus", "num_gpus", "object_store_memory", "include_dashboard"):
            options.pop(k, None)  # a running cluster's resources are its own
    ray.init(address=address, **options)
    return True


def stored_ids(store: Any, batch_size: int = 1000) -> set[str]:
    """Every id a store holds (its ``scan``), for ``resume=True``.

    >>> from uibk_embedding.adapters import open_store
    >>> stored_ids(open_store("exact"))
    set()
    """
    return {x for x, _ in store.scan(batch_size=batch_size)}


def encoder_format(encoder: EncoderSpec = None, encoder_options: Mapping[str, Any] | None = None,
                   encoder_urls: Sequence[str] | None = None) -> TaggedFormat:
    """The tagged format (with the projection) of the lists the actors will make: asked of the
    first server, else read from the encoder loaded once on the driver's CPU.

    >>> encoder_format().projection.startswith("random-")
    True
    """
    if encoder_urls:
        return RemoteEncoder(encoder_urls[0]).format
    if callable(encoder):
        return encoder().format

    return load_encoder(encoder, **{**dict(encoder_options or {}), "device": "cpu"}).format


def with_pool_factor(encoder: EncoderSpec, encoder_options: Mapping[str, Any] | None,
                     encoder_urls: Sequence[str] | None, pool_factor: int | None) -> dict[str, Any] | None:
    """``encoder_options`` with ``index_distributed(pool_factor=N)`` added (each actor's encoder
    pools its documents, docs/format.md#pooling); ``None`` leaves them as given. A server or an
    encoder factory makes its own lists: for them ``pool_factor`` is refused here (make the
    encoder, or start the server, with it).

    >>> with_pool_factor(None, {"projection": "pca"}, None, 2)
    {'projection': 'pca', 'pool_factor': 2}
    >>> with_pool_factor(None, None, ["http://h:8000"], 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: pool_factor= applies to an encoder the actors load; ...
    """
    options = dict(encoder_options or {})
    if pool_factor is None:
        return options or None
    pool_factor = check_pool_factor_value(pool_factor)
    if encoder_urls or callable(encoder):
        made = "the servers" if encoder_urls else "the encoder factory"
        raise ValueError(f"pool_factor= applies to an encoder the actors load; {made} make their own "
                         "lists: give the pool factor to the encoder they make (load_encoder(pool_factor=N), "
                         "uibk-embed serve of an encoder saved with it)")
    if options.get("pool_factor", pool_factor) != pool_factor:
        raise ValueError(f"pool_factor={pool_factor} and encoder_options pool_factor="
                         f"{options['pool_factor']} disagree")
    return {**options, "pool_factor": pool_factor}


def index_distributed(
    data: Any,
    backend: str,
    store_options: Mapping[str, Any],
    *,
    encoder: EncoderSpec = None,
    encoder_options: Mapping[str, Any] | None = None,
    encoder_urls: Sequence[str] | None = None,
    pool_factor: int | None = None,
    workers: int | None = None,
    num_gpus: float = 0.0,
    num_cpus: float = 1.0,
    batch_size: int = 256,
    upsert_batch: int = 64,
    store_text: bool = True,
    resume: bool = False,
    skip_bad: bool = False,
    retries: int = 3,
    ray_address: str | None = None,
    ray_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    total: int | None = None,
    id_column: str = "_id",
    text_column: str = "text",
    title_column: str | None = "title",
    metadata_column: str | None = "metadata",
    position_column: str | None = None,
) -> DistributedResult:
    """Encode ``data`` on a pool of Ray actors that upsert into ``backend`` themselves.

    Parameters
    ----------
    data: a Ray Dataset, a BEIR folder or JSONL file, Parquet file(s)/folder, or a list of
        Documents / dicts (see :func:`to_dataset`; column names for Datasets and Parquet below).
    backend, store_options: the store every actor opens (``open_store(backend, **options)``);
        the driver opens it first, so the collection exists before the actors connect.
    encoder: None (the embedded default), an encoder folder, or a zero-argument callable that
        returns an encoder (pickled to the actors); ``encoder_options`` go to ``load_encoder``.
    encoder_urls: ``uibk-embed serve`` servers to use instead of a model in each actor; each
        actor starts at a random server and takes them in turn, batch by batch.
    pool_factor: token pooling of the documents (:mod:`uibk_embedding.token_pooling`; None: the
        encoder's own, 1 unless its folder says), given to each actor's ``load_encoder``; the
        store records it, and one that recorded another is refused before any document is encoded.
    workers: actors in the pool (default: the cluster's GPUs / ``num_gpus`` when ``num_gpus`` > 0, else 2).
    num_gpus, num_cpus: resources per actor (``num_gpus=1``: one encoder per GPU); on CPU the
        actor's torch uses ``num_cpus`` threads. More than the cluster has is refused
        (:func:`check_cluster`); the input's read and row-check tasks ask for no CPU.
    batch_size: rows per Ray batch (one task, one encode call, sorted by length inside);
        ``upsert_batch``: documents per store write.
    store_text: keep title and text in the metadata (as ``uibk-embed index`` does).
    resume: skip ids the store already holds (listed once with ``store.scan()``).
    skip_bad: leave bad rows out and list them in the result, instead of raising
        :class:`BadDocuments` after the run.
    retries: actor restarts and task retries Ray may spend (``max_restarts`` /
        ``max_task_retries``, an int >= 0); a retried batch rewrites the same ids. The numeric
        arguments are checked before Ray starts (:func:`check_arguments`).
    ray_address, ray_options: where to run (None: the running cluster, else a new local one);
        options go to ``ray.init`` when this call starts Ray (and then shuts it down).
    progress: a progress bar on the driver (None: on a terminal).
    total: the number of rows, for progress, when ``data`` is a Dataset (else ``ds.count()``).

    The store must be a server (checked before Ray starts):

    >>> index_distributed([], "milvus-lite", {})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: backend 'milvus-lite' lives inside one process; ...
    """
    ray = _ray()

    encoder_options = with_pool_factor(encoder, encoder_options, encoder_urls, pool_factor)
    check_backend(backend, store_options)
    check_arguments(workers=workers, num_gpus=num_gpus, num_cpus=num_cpus, batch_size=batch_size,
                    upsert_batch=upsert_batch, retries=retries, total=total)
    started = init_ray(ray_address, **dict(ray_options or {}))
    try:
        check_cluster(ray.cluster_resources(), num_cpus=num_cpus, num_gpus=num_gpus)
        from ray.data import DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False
        # creates the collection once, recording the encoder's format and projection
        fmt = encoder_format(encoder, encoder_options, encoder_urls)
        store = open_store(backend, format=fmt, **dict(store_options))
        try:
            if same_pooling_but_ids(store.format, fmt):  # the actors adopt the store's ids
                fmt = replace(fmt, pool_frequent_ids=store.format.pool_frequent_ids)
            check_pool_factor(store.format, fmt, f"the {backend} store")
            skip: list[Any] = []
            if resume:
                have = stored_ids(store)
                if have:
                    skip = [ray.put(frozenset(have))]
            ds, n = to_dataset(data, batch_size=batch_size, id_column=id_column, text_column=text_column,
                               title_column=title_column, metadata_column=metadata_column,
                               position_column=position_column)
            if n is None:
                n = total if total is not None else ds.count()
            if workers is None:
                gpus = int(ray.cluster_resources().get("GPU", 0)) if num_gpus else 0
                workers = max(1, int(gpus // num_gpus)) if gpus else 2
            _warn_if_starved(data, ray.cluster_resources(), workers * num_cpus)
            from ray.data import ActorPoolStrategy

            with warnings.catch_warnings():
                # max_restarts / max_task_retries have no named parameter in Ray 2.60; they go
                # through ray_remote_args, deprecated for removal in Ray 2.64 (hence ray<2.64)
                warnings.filterwarnings("ignore", message=".*ray_remote_args.*is deprecated")
                out = ds.map_batches(
                    IndexWorker, batch_size=batch_size, batch_format="numpy",
                    compute=ActorPoolStrategy(size=workers),
                    num_cpus=num_cpus, num_gpus=num_gpus or None,
                    fn_constructor_kwargs={
                        "backend": backend, "store_options": dict(store_options), "encoder": encoder,
                        "encoder_options": dict(encoder_options or {}),
                        "encoder_urls": list(encoder_urls or []), "skip": skip,
                        "store_text": store_text, "upsert_batch": upsert_batch,
                        "threads": None if (num_gpus or encoder_urls) else max(1, int(num_cpus))},
                    max_restarts=retries, max_task_retries=retries)
            result = _drive(out, n, progress)
        finally:
            store.close()
    finally:
        if started:
            ray.shutdown()
    if result.bad and not skip_bad:
        raise BadDocuments(result.bad, result.indexed)
    return result


def check_arguments(*, workers: int | None = None, num_gpus: float = 0.0, num_cpus: float = 1.0,
                    batch_size: int = 256, upsert_batch: int = 64, retries: int = 3,
                    total: int | None = None) -> None:
    """The numeric arguments of :func:`index_distributed`, checked before Ray starts (``ValueError``
    naming the first bad one): ``batch_size=0`` was a ZeroDivisionError after ``ray.init``, and a
    negative ``retries`` is unlimited restarts in Ray.

    >>> check_arguments(retries=-1)
    Traceback (most recent call last):
    ...
    ValueError: retries must be a non-negative int, got -1
    """
    check_positive("workers", workers, allow_none=True)
    check_positive("batch_size", batch_size)
    check_positive("upsert_batch", upsert_batch)
    check_positive("retries", retries, allow_zero=True)
    check_positive("total", total, allow_zero=True, allow_none=True)
    for name, value, low in (("num_cpus", num_cpus, "a positive"), ("num_gpus", num_gpus, "a non-negative")):
        if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                or value < 0 or (value == 0 and name == "num_cpus")):
            raise ValueError(f"{name} must be {low} number, got {value!r}")


def check_cluster(resources: Mapping[str, float], *, num_cpus: float = 1.0, num_gpus: float = 0.0) -> None:
    """Refuse actors the cluster cannot place (``ValueError``): Ray would wait for them forever,
    without a word (``num_gpus=1`` on a cluster without a GPU). ``resources``:
    ``ray.cluster_resources()`` (what the cluster has when the run starts; an autoscaling cluster
    must have its GPU nodes up).

    >>> check_cluster({"CPU": 2.0}, num_gpus=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: num_gpus=1 per actor, but the Ray cluster has 0 GPUs: no actor could start ...
    """
    for name, key, want in (("num_gpus", "GPU", num_gpus), ("num_cpus", "CPU", num_cpus)):
        have = float(resources.get(key, 0.0))
        if want and want > have:
            fix = "; pass num_gpus=0 (no --num-gpus) to encode on CPUs" if key == "GPU" else ""
            raise ValueError(f"{name}={want:g} per actor, but the Ray cluster has {have:g} {key}s: no actor "
                             f"could start (Ray would wait for one forever){fix}, or connect to a cluster "
                             "that has them (ray_address=)")


def _warn_if_starved(data: Any, resources: Mapping[str, float], actor_cpus: float) -> None:
    """A user's Ray Dataset with steps still to run (a ``read_parquet``, a ``map_batches``) whose
    tasks ask for a CPU waits forever when the actors hold every CPU: say so before it starts."""
    import ray.data
    from ray.data.dataset import MaterializedDataset

    if not isinstance(data, ray.data.Dataset) or isinstance(data, MaterializedDataset):
        return
    cpus = float(resources.get("CPU", 0.0))
    if actor_cpus >= cpus:
        warnings.warn(f"the actors take {actor_cpus:g} of the cluster's {cpus:g} CPUs: the steps of the "
                      "given Dataset (its reads, its map_batches) that ask for a CPU cannot run, and the run "
                      "waits forever; give them num_cpus=0, materialize() the Dataset, or leave a CPU "
                      "free (fewer workers, a smaller num_cpus)", stacklevel=3)


def _drive(out: Any, total: int, progress: bool | None) -> DistributedResult:
    """Run the pipeline, reading the actors' counters as they come: progress and the result."""
    result = DistributedResult(total=total)
    pids: dict[int, None] = {}
    disable = {True: False, False: True}.get(progress, None)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    with tqdm(total=total, desc="indexing (ray)", unit="doc", disable=disable) as bar:
        for row in out.iter_rows():
            result.batches += 1
            result.indexed += int(row["indexed"])
            result.encoded += int(row["encoded"])
            result.skipped_existing += int(row["skipped"])
            result.encode_seconds += float(row["encode_s"])
            result.upsert_seconds += float(row["upsert_s"])
            result.bad.extend(BadDocument(b["id"], _position(b["position"]), b["reason"])
                              for b in json.loads(row["bad"]))
            pids[int(row["pid"])] = None
            bar.update(int(row["rows"]))
            el = time.perf_counter() - t0
            bar.set_postfix_str(f"{(result.indexed + result.skipped_existing) / el:.1f} docs/s")
    result.seconds = time.perf_counter() - t0
    result.worker_pids = list(pids)
    result.bad.sort(key=lambda b: _position_key(b.position))
    return result


def _position(p: Any) -> Any:
    """Positions travel as strings (one Arrow type): list indexes come back as ints."""
    return int(p) if isinstance(p, str) and p.isdigit() else (None if p in (None, "None") else p)


def _position_key(p: Any) -> tuple:
    if isinstance(p, int):
        return ("", p)
    head, _, tail = str(p).rpartition(":")
    return (head, int(tail)) if tail.isdigit() else (str(p), -1)


__all__ = ["BadDocument", "BadDocuments", "DistributedResult", "IndexWorker", "check_arguments",
           "check_backend", "check_cluster", "index_distributed", "init_ray", "read_rows", "stored_ids",
           "to_dataset"]
