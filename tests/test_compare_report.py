"""``uibk-embed compare`` (issue #42): the dense weight of search/eval and stated in the report,
the local backends by default, and the agreement figures named for what they are."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.apps import compare
from uibk_embedding.apps.cli import main as cli_main


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(tmp_path / "uibk-cache"))


def test_compare_scores_at_the_dense_weight_of_eval_and_says_so(datasets, tmp_path, capsys):
    data = str(datasets / "limit-small")
    assert cli_main(["eval", data, "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    out = tmp_path / "out"
    assert compare.main([data, "--backends", "exact", "--out", str(out), "--quiet", "--threads", "1"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["dense_weight"] == ev["dense_weight"] == 4
    assert res["backends"]["exact"]["ndcg@10"] == pytest.approx(ev["metrics"]["fused"]["ndcg@10"], abs=1e-4)
    md = (out / "compare.md").read_text()
    assert "dense weight 4" in md.splitlines()[0]
    # the agreement figures are named for what they are; identical top-10s are shown
    assert "rank agreement" not in md
    assert "identical top-10 vs exact" in md and "shared pairs in exact order" in md
    r = res["backends"]["exact"]
    assert r["identical_top10"] == 1.0 and r["shared_pair_order@10"] == 1.0 and "rank_agreement@10" not in r

    assert compare.main([data, "--backends", "exact", "--out", str(out), "--quiet", "--threads", "1",
                         "--dense-weight", "1"]) == 0
    assert json.loads((out / "compare.json").read_text())["dense_weight"] == 1
    assert "dense weight 1" in (out / "compare.md").read_text().splitlines()[0]


def test_compare_without_backends_runs_the_local_ones(monkeypatch):
    monkeypatch.delenv("QDRANT_URL", raising=False)
    names = [n for _, n in compare.chosen_backends(None)]
    assert "exact" in names and "qdrant-edge" in names and "qdrant" in names
    assert not {"milvus", "pgvector", "weaviate"} & set(names)
    monkeypatch.setenv("QDRANT_URL", "http://127.0.0.1:1")  # qdrant would be a server now
    assert "qdrant" not in [n for _, n in compare.chosen_backends(None)]
    assert {"milvus", "pgvector", "weaviate"} <= {n for _, n in compare.chosen_backends("all")}
    assert compare.build_parser().parse_args(["data"]).backends is None


def test_compare_dense_weight_must_be_positive(tmp_path):
    with pytest.raises(SystemExit) as e:
        compare.main([str(tmp_path), "--dense-weight", "0"])
    assert e.value.code == 2


@pytest.mark.parametrize("option", ["--max-docs", "--max-queries", "--repeat", "--threads"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_compare_counts_must_be_positive(tmp_path, capsys, option, value):
    """``--max-docs 0`` ran the whole collection and ``-2`` cut two documents twice."""
    with pytest.raises(SystemExit) as e:
        compare.main([str(tmp_path), option, value])
    assert e.value.code == 2 and f"{option}: must be positive, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_compare_timeout_must_be_positive_seconds(tmp_path, capsys, value):
    # -1 skipped every backend ("timed out after -1 s") and exited 0
    with pytest.raises(SystemExit) as e:
        compare.main([str(tmp_path), "--timeout", value])
    assert e.value.code == 2 and "--timeout: must be a positive number of seconds" in capsys.readouterr().err


def test_a_backend_that_ran_no_query_reports_no_latency_not_nan():
    # _percentile([]) was NaN, which compare.json wrote as NaN: not JSON
    import json

    from uibk_embedding.apps.compare_metrics import summarise

    res = {"runs": {}, "latencies_s": [], "build_s": 50.0, "upsert_s": 49.0, "peak_rss_mb": 1.0,
           "base_rss_mb": 1.0, "count": 6, "queries_run": 0}
    out = summarise(res, {"q1": {"d0": 1}}, {"q1": ["d0"]})
    assert out["latency_ms_p50"] is None and out["latency_ms_p95"] is None
    json.loads(json.dumps(out), parse_constant=lambda c: pytest.fail(f"{c} in the report"))


def test_an_exact_run_cut_short_by_its_time_budget_is_not_the_reference(monkeypatch, tmp_path):
    """The exact store stopped after one query of three (its worker's time budget): the other
    backends' agreement figures were computed over that one query (1.0 where they agree on 1 of 3)."""
    import numpy as np

    from uibk_embedding.apps.compare_metrics import exact_runs
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    fmt, rng = TaggedFormat(), np.random.default_rng(0)
    ids = [f"d{i}" for i in range(40)]
    docs, qids = [make_list(fmt, rng, 6) for _ in ids], ["q0", "q1", "q2"]
    qs = [make_list(fmt, rng, 4) for _ in qids]
    ref = exact_runs(docs, ids, qs, qids)
    wrong = [x for x in ids if x not in ref["q1"] + ref["q2"]][:10]  # shares nothing with q1/q2's top 10

    def worker_result(label, name, opts, arrays, folder, repeat, timeout, threads=None):
        runs = {"q0": ref["q0"]} if label == "exact" else {"q0": ref["q0"], "q1": wrong, "q2": wrong}
        return {"runs": runs, "latencies_s": [0.01] * len(runs), "build_s": 1.0, "upsert_s": 1.0,
                "peak_rss_mb": 1.0, "base_rss_mb": 1.0, "count": len(ids), "queries_run": len(runs)}

    monkeypatch.setattr(compare, "_run_backend", worker_result)
    out = compare.compare(ids, docs, qids, qs, {q: {ref[q][0]: 1} for q in qids},
                          [("exact", "exact"), ("x", "plaid")], {}, workdir=tmp_path)
    assert out["x"]["identical_top10"] == pytest.approx(1 / 3, abs=1e-4)  # figures are rounded to 4 places
    assert out["x"]["recall@10_vs_exact"] == pytest.approx(1 / 3, abs=1e-4)


def test_compare_runs_lancedb_beside_exact(datasets, tmp_path):
    """LanceDB is one of the local backends compare runs by default; in its exact mode (flat
    MaxSim) its top 10 hold the exact store's documents. The order may differ where two scores
    are within float32 rounding (measured: query_416 of limit-small, two documents 1e-6 apart,
    ranked one way by the exact store's float32 scan and the other by LanceDB's float64 rescore),
    so identical lists are not asserted."""
    pytest.importorskip("lancedb")
    assert "lancedb" in [n for _, n in compare.chosen_backends(None)]
    out = tmp_path / "out"
    assert compare.main([str(datasets / "limit-small"), "--backends", "exact,lancedb", "--out", str(out),
                         "--quiet", "--threads", "1"]) == 0
    res = json.loads((out / "compare.json").read_text())["backends"]
    assert res["lancedb"]["recall@10_vs_exact"] == 1.0


def test_compare_interleaved_runs_every_backend_in_one_process_side_by_side(datasets, tmp_path):
    """``--interleave`` (the NPL side by side of docs/lancedb.md): every backend in this process,
    the queries going round them, each query's latency the median of its passes; LanceDB exact
    and its index mode (here indexed from 20 rows) beside the exact store. With a document and
    query limit and no cached encoding, only that part of the collection is encoded."""
    pytest.importorskip("lancedb")
    import numpy as np

    from uibk_embedding.apps.evaluation import cache_dir

    out = tmp_path / "out"
    argv = [str(datasets / "limit-small"), "--interleave", "--repeat", "2", "--max-docs", "30",
            "--max-queries", "12", "--backends", "exact,lancedb-exact=lancedb,lancedb-index=lancedb",
            "--option", "lancedb-index:mode=index", "--option", "lancedb-index:index_min_rows=20",
            "--out", str(out), "--quiet"]
    assert compare.main(argv) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["interleaved"] is True and res["repeat"] == 2 and res["n_docs"] == 30
    assert "queries interleaved across the backends (median of 2 passes)" in \
        (out / "compare.md").read_text().splitlines()[0]
    for label in ("exact", "lancedb-exact", "lancedb-index"):
        r = res["backends"][label]
        assert "skipped" not in r, r
        assert r["count"] == 30 and r["queries_run"] == 12 and r["index_bytes"] > 0
        assert r["build_s"] > 0 and r["latency_ms_p95"] >= r["latency_ms_p50"] > 0
        assert r["peak_rss_mb"] is None  # one process: no memory per backend
    assert res["backends"]["lancedb-exact"]["recall@10_vs_exact"] == 1.0
    assert res["backends"]["lancedb-index"]["recall@10_vs_exact"] >= 0.95
    (cached,) = cache_dir().glob("*.npz")  # only the 30 documents were encoded
    with np.load(cached) as z:
        assert len(json.loads(str(z["doc_ids"]))) == 30


def test_compare_interleaved_refuses_threads(tmp_path):
    with pytest.raises(SystemExit, match="--threads caps the worker processes"):
        compare.main([str(tmp_path), "--interleave", "--threads", "1"])


def test_compare_times_the_plaid_and_warp_engines_and_says_which_path_answered(datasets, tmp_path):
    """PLAID and WARP search exactly below ``min_index_vectors`` (millions of vectors by default),
    so with the stores' defaults compare timed the exact scan under their names. Its defaults
    index them at any size, and the report says which path answered each backend and the load
    average around the run."""
    pytest.importorskip("fast_plaid")
    pytest.importorskip("xtr_warp")
    out = tmp_path / "out"
    assert compare.main([str(datasets / "limit-small"), "--interleave", "--max-queries", "4",
                         "--backends", "exact,plaid,warp", "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert {label: r["search"] for label, r in res["backends"].items()} == {
        "exact": "exact", "plaid": "index", "warp": "index"}
    assert all(len(res["load_average"][w]) == 3 for w in ("before", "after"))
    md = (out / "compare.md").read_text()
    assert "| search |" in md and "Load average (1, 5, 15 min) before: " in md


def test_compare_runs_lists_of_another_tagged_format(tmp_path):
    """Stores check every list's tags against their format; compare opened its stores without
    one (the released format), so every backend refused the lists of an encoder with other
    constants. It opens them with the lists' own format, in the worker and interleaved."""
    import numpy as np

    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    fmt, rng = TaggedFormat(beta=0.8, lambda_=0.75), np.random.default_rng(0)
    docs, qs = [make_list(fmt, rng, 6) for _ in range(5)], [make_list(fmt, rng, 4) for _ in range(3)]
    ids, qids = [f"d{i}" for i in range(5)], ["q0", "q1", "q2"]
    raw = compare.interleaved(ids, docs, qids, qs, [("a", "exact")], {}, tmp_path / "i")
    assert "skipped" not in raw["a"], raw["a"]
    out = compare.compare(ids, docs, qids, qs, {}, [("a", "exact")], {}, workdir=tmp_path / "w")
    assert "skipped" not in out["a"], out["a"]
