"""pgvector candidate strategies on NPL: dense-HNSW candidates vs token-row candidates.

Both rescore their candidates with exact MaxSim; they differ in how candidates are found:

* ``dense``: the store's own ``exact=False`` mode: the ``c`` documents nearest to the query's
  381-d dense vector (one HNSW index over one vector per document);
* ``tokens``: a side table with one row per stored vector (``doc_id``, ``vector(128)``, HNSW
  ``vector_ip_ops``); every query vector takes its ``n`` nearest rows (one SQL statement,
  ``LATERAL``), the union of their documents is rescored from the store's table.

Reports build time (the store; the token table and its index separately), size on the server,
p50/p95 latency and recall@10 against exact MaxSim, on a real local PostgreSQL 18 + pgvector 0.8
(:class:`~uibk_embedding.testing.pg_server.LocalPostgresServer`) or ``--dsn``.

    python benchmarks/pgvector_candidates.py --docs 3000
    python benchmarks/pgvector_candidates.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.pgvector import PgVectorStore
from uibk_embedding.apps.data import load_beir
from uibk_embedding.apps.evaluation import encode_collection
from uibk_embedding.encoder import load_encoder
from uibk_embedding.rank import rerank
from uibk_embedding.testing import datasets_dir
from uibk_embedding.testing.pg_server import LocalPostgresServer

K = 10


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1000, q))


def recall(runs: list[list[str]], ref: list[list[str]]) -> float:
    return statistics.mean(len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(runs, ref, strict=True))


def build_token_table(store: PgVectorStore, ids: list[str], docs: list[np.ndarray], m: int,
                      efc: int) -> float:
    """The side table of token rows and its HNSW index; seconds taken."""
    conn, t = store.conn, store.table
    t0 = time.perf_counter()
    conn.execute(f"CREATE TABLE {t}_tok (doc_id text NOT NULL, vec vector(128) NOT NULL)")
    with conn.cursor() as cur, cur.copy(f"COPY {t}_tok (doc_id, vec) FROM STDIN WITH (FORMAT BINARY)") as cp:
        cp.set_types(["text", "vector"])
        for x, d in zip(ids, docs, strict=True):
            for row in d[3:]:  # token rows: the dense part has its own index
                cp.write_row((x, row))
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(f"CREATE INDEX ON {t}_tok USING hnsw (vec vector_ip_ops) "
                 f"WITH (m = {m}, ef_construction = {efc})")
    return time.perf_counter() - t0


def token_search(store: PgVectorStore, q: np.ndarray, n: int) -> list[str]:
    conn, t = store.conn, store.table
    with conn.transaction():
        conn.execute(f"SET LOCAL hnsw.ef_search = {max(n, 40)}")
        rows = conn.execute(
            f"SELECT DISTINCT c.doc_id FROM unnest(%s::vector[]) AS qv(v) CROSS JOIN LATERAL "
            f"(SELECT doc_id FROM {t}_tok ORDER BY vec <#> qv.v LIMIT %s) c",
            ([r for r in q[3:]], n)).fetchall()
        cand = [r[0] for r in rows]
    recs = store.get(cand)
    return [recs[i].id for i, _ in rerank(q, [r.vectors for r in recs], K)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="npl")
    ap.add_argument("--docs", type=int, default=0, help="first N documents only (0: all)")
    ap.add_argument("--dense", default="32,100,300", help="dense candidate budgets")
    ap.add_argument("--tokens", default="4,16", help="nearest token rows per query vector")
    ap.add_argument("--no-tokens", action="store_true", help="skip the token-row table")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=64)
    ap.add_argument("--dsn", default=os.environ.get("PG_DSN", ""))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    coll = load_beir(datasets_dir() / args.dataset)
    enc = encode_collection(load_encoder(), coll)
    if args.docs:
        enc.doc_ids, enc.docs = enc.doc_ids[: args.docs], enc.docs[: args.docs]
    n_vec = sum(len(d) for d in enc.docs)
    print(f"{len(enc.docs)} docs, {n_vec} vectors, {len(enc.queries)} queries; load {os.getloadavg()}")
    exact = ExactStore()
    exact.upsert(enc.doc_ids, enc.docs)
    ref = [[h.id for h in exact.search(q, k=K)] for q in enc.queries]

    server = None
    dsn = args.dsn
    if not dsn:
        server = LocalPostgresServer()
        dsn = server.start()
    out: dict = {"dataset": coll.name + (f" (first {args.docs} docs)" if args.docs else ""),
                 "docs": len(enc.docs), "vectors": n_vec, "load_before": os.getloadavg(), "rows": []}
    store = PgVectorStore(dsn, table=f"bench_{os.getpid()}", exact=False, m=args.m,
                          ef_construction=args.ef_construction)
    try:
        t0 = time.perf_counter()
        for i in range(0, len(enc.docs), 256):
            store.upsert(enc.doc_ids[i:i + 256], enc.docs[i:i + 256])
        out["build_s"] = time.perf_counter() - t0
        out["size_mib"] = store.size_bytes() / 2**20
        print(f"store: {out['build_s']:.1f} s, {out['size_mib']:.1f} MiB")
        for c in [int(x) for x in args.dense.split(",") if x]:
            store.candidates, store.ef_search = c, min(max(c, 40), 1000)
            store.search(enc.queries[0], k=K)
            lat, runs = [], []
            for q in enc.queries:
                t = time.perf_counter()
                runs.append([h.id for h in store.search(q, k=K)])
                lat.append(time.perf_counter() - t)
            row = {"strategy": "dense", "budget": c, "recall@10": recall(runs, ref),
                   "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95)}
            out["rows"].append(row)
            print(row)
        if not args.no_tokens:
            out["token_build_s"] = build_token_table(store, enc.doc_ids, enc.docs, args.m,
                                                     args.ef_construction)
            size = store.conn.execute(f"SELECT pg_total_relation_size('{store.table}_tok')").fetchone()[0]
            out["token_size_mib"] = size / 2**20
            print(f"token table: {out['token_build_s']:.1f} s, {out['token_size_mib']:.1f} MiB")
            for n in [int(x) for x in args.tokens.split(",") if x]:
                token_search(store, enc.queries[0], n)
                lat, runs = [], []
                for q in enc.queries:
                    t = time.perf_counter()
                    runs.append(token_search(store, q, n))
                    lat.append(time.perf_counter() - t)
                row = {"strategy": "tokens", "budget": n, "recall@10": recall(runs, ref),
                       "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95)}
                out["rows"].append(row)
                print(row)
            store.conn.execute(f"DROP TABLE {store.table}_tok")
        out["load_after"] = os.getloadavg()
    finally:
        store.drop()
        store.close()
        if server is not None:
            server.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
