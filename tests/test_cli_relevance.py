"""``uibk-embed search`` shows each hit's relevance (issue #61): the raw MaxSim grows with the
query's length, so a gibberish query scored above a related one (14.57 against 12.99); the
relevance in [0, 1] puts the related query's best hit above the gibberish one's, in the table and
in ``--json``."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.apps.cli import main

DOCS = ["the lift of a wing in a propeller slipstream", "a sourdough bread recipe with rye flour",
        "flutter of thin panels in supersonic flow", "heat transfer in a laminar boundary layer"]
RELATED = "how does a propeller slipstream change the lift of a wing"
GIBBERISH = "qzx vlorp ttrank mmnbv xoqq plarf zzkt wrrb qqlo vntz kkrp"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("cli-relevance")
    corpus = d / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    assert main(["index", str(corpus), "--path", str(d / "store"), "--quiet"]) == 0
    return str(d / "store")


def _search_json(store: str, query: str, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["search", query, "--path", store, "--json", "-k", "4"]) == 0
    return json.loads(capsys.readouterr().out)["hits"]


def test_search_json_gives_every_hit_a_relevance(store, capsys):
    related, gibberish = _search_json(store, RELATED, capsys), _search_json(store, GIBBERISH, capsys)
    for hits in (related, gibberish):
        assert len(hits) == 4 and all(0 <= h["relevance"] <= 1 for h in hits)
        assert [h["relevance"] for h in hits] == sorted((h["relevance"] for h in hits), reverse=True)
    assert related[0]["id"] == "d0"
    assert related[0]["relevance"] > 0.5 > gibberish[0]["relevance"]


def test_search_table_has_a_relevance_column(store, capsys):
    capsys.readouterr()
    assert main(["search", RELATED, "--path", store, "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["rank", "score", "relevance"])
    row = lines[head + 1].split()
    assert row[0] == "1" and row[6] == "d0" and 0.5 < float(row[2]) <= 1
