"""Indexing throughput into the real Milvus standalone server: one process vs a Ray actor pool.

End to end, Cranfield documents (the first ``--docs``, corpus order) from a JSONL file into a
fresh Milvus collection (``token_rows``, FLAT rows) on :class:`LocalMilvusServer`:

* ``single``: the ``uibk-embed index`` path in this process (encoder loaded beforehand, torch's
  default threads), reported with and without the model load;
* ``setup s``: reading the input and creating the collection (both paths), before any encoding;
  for Ray, everything before the actor pool starts;
* ``ray AxT``: :func:`uibk_embedding.apps.distributed.index_distributed` with ``A`` actors of ``T``
  CPUs (torch threads) each, on a local Ray cluster of ``--cpus`` CPUs. The pipeline time
  includes starting the actors and loading one model in each; Ray's own startup
  (``ray.init``) is measured separately, per run. ``encode s`` / ``upsert s`` are summed over
  the actors (CPU seconds in parallel, not wall time).

Ray's overhead on its own: ``ray.init`` + ``ray.shutdown``, and the time per batch of a pipeline
whose actors do nothing (the same batches through a no-op callable class: (T(B batches) -
T(1 batch)) / (B - 1)). Each configuration runs ``--runs`` times; medians are reported.

    python benchmarks/ray_index.py --docs 300 --runs 3 --json benchmarks/results/ray_index.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from uibk_embedding.adapters.milvus import MilvusStore
from uibk_embedding.apps.data import read_corpus
from uibk_embedding.apps.distributed import index_distributed
from uibk_embedding.encoder import load_encoder
from uibk_embedding.testing import datasets_dir
from uibk_embedding.testing.milvus_server import LocalMilvusServer


class Noop:
    """A Ray Data callable class that does nothing: Ray's own cost per batch."""

    def __call__(self, batch):
        return {"n": [len(batch["_id"])]}


def store_options(uri: str, name: str) -> dict:
    return {"uri": uri, "collection": name, "exact": True, "index_type": "FLAT"}


def drop(uri: str, name: str) -> None:
    with MilvusStore(**store_options(uri, name)) as s:
        s.drop()


def single(path: Path, uri: str, name: str, batch_size: int, enc) -> dict:
    """The single-process path of `uibk-embed index` (cli.cmd_index), timed in parts."""
    t0 = time.perf_counter()
    docs = read_corpus(path)
    store = MilvusStore(**store_options(uri, name))
    open_s = time.perf_counter() - t0
    enc_s = up_s = 0.0
    for i in range(0, len(docs), batch_size):
        batch = docs[i:i + batch_size]
        a = time.perf_counter()
        vecs = enc.encode_documents([d.full_text for d in batch], show_progress=False)
        b = time.perf_counter()
        store.upsert([d.id for d in batch], vecs,
                     [{**d.metadata, "title": d.title, "text": d.text} for d in batch])
        up_s += time.perf_counter() - b
        enc_s += b - a
    total = time.perf_counter() - t0
    n = store.count()
    store.close()
    return {"seconds": total, "setup_s": open_s, "encode_s": enc_s, "upsert_s": up_s, "stored": n}


def ray_run(path: Path, uri: str, name: str, actors: int, threads: int, batch_size: int,
            cpus: int, tmp: str) -> dict:
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=cpus, object_store_memory=200 * 1024 ** 2, include_dashboard=False,
             _temp_dir=tmp, log_to_driver=False)
    init_s = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        r = index_distributed(path, "milvus", store_options(uri, name), workers=actors,
                              num_cpus=threads, batch_size=batch_size, progress=False)
        pipe = time.perf_counter() - t1
        with MilvusStore(**store_options(uri, name)) as s:
            n = s.count()
    finally:
        t2 = time.perf_counter()
        ray.shutdown()
        down_s = time.perf_counter() - t2
    return {"seconds": pipe, "init_s": init_s, "shutdown_s": down_s, "stored": n,
            "encode_s": r.encode_seconds, "upsert_s": r.upsert_seconds, "batches": r.batches,
            "pipeline_s": r.seconds, "setup_s": pipe - r.seconds}


def per_batch_overhead(n_rows: int, batches: int, actors: int, cpus: int, tmp: str) -> dict:
    """Ray Data's own time per batch: no-op actors over ``batches`` batches vs 1 batch."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    ray.init(num_cpus=cpus, object_store_memory=200 * 1024 ** 2, include_dashboard=False,
             _temp_dir=tmp, log_to_driver=False)
    DataContext.get_current().enable_progress_bars = False
    try:
        rows = [{"_id": str(i), "_text": "x" * 100} for i in range(n_rows)]

        def run(nb: int) -> float:
            bs = -(-n_rows // nb)
            ds = ray.data.from_items(rows, override_num_blocks=nb)
            t = time.perf_counter()
            out = ds.map_batches(Noop, batch_size=bs, batch_format="numpy",
                                 compute=ActorPoolStrategy(size=actors))
            assert sum(r["n"] for r in out.iter_rows()) == n_rows
            return time.perf_counter() - t

        run(1)  # warm: first use of Ray Data in the session
        one = statistics.median(run(1) for _ in range(3))
        many = statistics.median(run(batches) for _ in range(3))
    finally:
        ray.shutdown()
    return {"one_batch_s": one, "batches": batches, "many_batches_s": many,
            "per_batch_s": (many - one) / (batches - 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=50, help="documents per Ray batch / encode call")
    ap.add_argument("--configs", default="2x1,1x2", help="Ray actor pools: ACTORSxTHREADS,...")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs of the local Ray cluster")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    src = datasets_dir() / "cranfield" / "corpus.jsonl"
    tmpdir = tempfile.mkdtemp(prefix="uibk-ray-bench-")
    path = Path(tmpdir) / "corpus.jsonl"
    path.write_text("\n".join(src.read_text().splitlines()[: args.docs]) + "\n")
    server = LocalMilvusServer.shared()
    uri = server.uri
    out: dict = {"docs": args.docs, "runs": args.runs, "batch_size": args.batch_size, "cpus": args.cpus,
                 "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                 "loadavg_start": os.getloadavg(), "results": {}}

    t = time.perf_counter()
    enc = load_encoder()
    enc.encode_documents(["warm up"], show_progress=False)
    load_s = time.perf_counter() - t
    out["model_load_s"] = load_s
    runs = []
    for i in range(args.runs):
        name = f"bench_single_{i}"
        runs.append(single(path, uri, name, args.batch_size, enc))
        drop(uri, name)
    out["results"]["single"] = runs
    for cfg in args.configs.split(","):
        a, th = (int(x) for x in cfg.split("x"))
        runs = []
        for i in range(args.runs):
            name = f"bench_ray_{a}x{th}_{i}"
            runs.append(ray_run(path, uri, name, a, th, args.batch_size, args.cpus, tmpdir + "/ray"))
            drop(uri, name)
        out["results"][f"ray {a}x{th}"] = runs
    nb = max(2, -(-args.docs // args.batch_size))
    out["per_batch_overhead"] = per_batch_overhead(args.docs, nb, 2, args.cpus, tmpdir + "/ray")
    out["loadavg_end"] = os.getloadavg()

    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    print(f"{args.docs} Cranfield documents -> Milvus standalone 2.3.5, medians of {args.runs} runs, "
          f"batch {args.batch_size}; model load {load_s:.1f} s")
    print(f"{'configuration':<16}{'docs/s':>8}{'wall s':>8}{'setup s':>9}{'encode s':>10}{'upsert s':>10}"
          f"{'ray.init s':>12}")
    for key, rs in out["results"].items():
        ok = all(r["stored"] == args.docs for r in rs)
        wall = med(rs, "seconds")
        init = f"{med(rs, 'init_s'):12.2f}" if "init_s" in rs[0] else f"{'-':>12}"
        print(f"{key:<16}{args.docs / wall:8.1f}{wall:8.1f}{med(rs, 'setup_s'):9.1f}"
              f"{med(rs, 'encode_s'):10.1f}{med(rs, 'upsert_s'):10.1f}{init}"
              f"{'' if ok else '  COUNT MISMATCH'}")
    o = out["per_batch_overhead"]
    cold = args.docs / (med(out["results"]["single"], "seconds") + load_s)
    print(f"single incl. model load: {cold:.1f} docs/s")
    print(f"Ray Data per batch (no-op actors, {o['batches']} batches vs 1): "
          f"{o['per_batch_s'] * 1000:.1f} ms; a 1-batch no-op pipeline: {o['one_batch_s']:.2f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
