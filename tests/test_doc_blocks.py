"""Every code block of README.md and docs/*.md runs (python blocks, and the ``uibk-embed``
lines of bash blocks), each in a fresh folder of its own.

A block that cannot run here says so on the line before its fence::

    <!-- doc-test: skip needs a Qdrant server -->

and is reported as skipped with that reason; ``<!-- doc-test: continues -->`` runs a python block
after the previous python block of its file, in the same namespace. Python blocks run with the
names a reader is told to bring already defined (:func:`reader_names`: ``texts``, ``encoder``,
``ids``, ``lists``, ``metadata``, ``query``, a filled exact ``store``, and ``llm``, a LangChain
or LlamaIndex stand-in model: the language model is the reader's, not this library's). Bash
blocks run their ``uibk-embed`` commands with ``corpus.jsonl`` (and ``my-corpus.jsonl``) of a
few documents in the folder.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from uibk_embedding.testing import datasets_dir

REPO = Path(__file__).resolve().parent.parent
FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SKIP = re.compile(r"<!--\s*doc-test:\s*skip\s+(.+?)\s*-->")
CONTINUES = re.compile(r"<!--\s*doc-test:\s*continues\s*-->")
TEXTS = ["the wing lift in a propeller slipstream", "boundary layer transition on a flat plate",
         "heat transfer in supersonic flow", "flutter of thin panels"]


@dataclass
class Block:
    file: Path
    line: int
    lang: str
    code: str
    skip: str | None
    after: Block | None = None  # the block this one continues

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(REPO)}:{self.line}"


def blocks() -> list[Block]:
    """The python and bash blocks of every file, with the skip reason written before each."""
    out = []
    for f in FILES:
        lines = f.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w+)\s*$", lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = lines[i - 1] if i else ""
            skip = SKIP.search(before)
            if m.group(1) in ("python", "bash"):
                after = None
                if CONTINUES.search(before):
                    after = next(b for b in reversed(out) if b.file == f and b.lang == "python")
                out.append(Block(f, i + 1, m.group(1), "\n".join(lines[i + 1:end]),
                                 skip.group(1) if skip else None, after))
            i = end + 1
    return out


BLOCKS = blocks()


def test_blocks_are_found() -> None:
    """The parser sees the README's blocks (a test of the test: a broken parser runs nothing)."""
    readme = [b for b in BLOCKS if b.file.name == "README.md"]
    assert sum(b.lang == "python" for b in readme) >= 4 and sum(b.lang == "bash" for b in readme) >= 4


# Blocks that left the README for a docs page (issue #61), by a line each holds: each must still be
# found there (and so runs there, or keeps its skip reason), and the README must link the page.
MOVED = {"docs/api.md": 'for hit in store.search(q, k=2, filter={"lang": "en"}, explain=True):',
         "docs/cli.md": "uibk-embed index ../shared/datasets/npl --backend exact --path ./npl-index",
         "docs/model.md": "uibk-embed index DATA --encoder models/uibk-embedding-v1"}


@pytest.mark.parametrize("page", sorted(MOVED))
def test_moved_blocks_are_found_in_their_page(page: str) -> None:
    here = [b for b in BLOCKS if b.file == REPO / page and MOVED[page] in b.code]
    assert len(here) == 1, f"{page} no longer holds the block with {MOVED[page]!r}"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"]({page})" in readme or f"]({page}#" in readme, f"README does not link {page}"


def _llm(code: str) -> object:
    if "llama_index" in code:
        from llama_index.core.llms import MockLLM

        return MockLLM()
    from langchain_core.language_models import FakeListChatModel

    return FakeListChatModel(responses=["an answer from the context"])


def _cli_lines(code: str) -> list[list[str]]:
    """The ``uibk-embed`` commands of a bash block (comments dropped, continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("uibk-embed "):
            out.append(shlex.split(line)[1:])
    return out


@pytest.fixture(scope="module")
def encoder() -> object:
    import uibk_embedding as ue

    return ue.load_encoder()


def reader_names(encoder: object, code: str) -> dict[str, object]:
    """What the docs assume the reader already has: their texts and encoder, documents encoded
    from them, a query, a store holding the documents, a language model."""
    import uibk_embedding as ue

    ids = [f"doc-{i}" for i in range(len(TEXTS))]
    lists = encoder.encode_documents(TEXTS)
    metadata = [{"lang": "en", "year": 1950 + 20 * i} for i in range(len(TEXTS))]
    store = ue.open_store("exact", format=encoder.format)
    store.upsert(ids, lists, metadata)
    query = encoder.encode_queries(["slipstream lift"])[0]
    names = {"__name__": "__doc_block__", "ue": ue, "texts": list(TEXTS),
            "encoder": encoder, "enc": encoder, "ids": ids, "lists": lists, "metadata": metadata,
            "query": query, "q": query, "store": store, "llm": _llm(code)}
    if "my_texts" in code or "sample_of_my_documents" in code:  # a sample to fit a projection on
        with open(datasets_dir() / "cranfield" / "corpus.jsonl", encoding="utf-8") as f:
            sample = [json.loads(line)["text"] for _, line in zip(range(300), f, strict=False)]
        names["my_texts"] = names["sample_of_my_documents"] = sample
    return names


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.skip(reason=b.skip)]
                                                if b.skip else []) for b in BLOCKS])
def test_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    encoder: object) -> None:
    monkeypatch.chdir(tmp_path)
    if block.lang == "python":
        chain = [block]
        while chain[0].after is not None:
            chain.insert(0, chain[0].after)
        code = "\n".join(b.code for b in chain)
        namespace = reader_names(encoder, code)
        if "Settings." in code:  # a block that sets LlamaIndex's global embed model sets it here only
            from llama_index.core import Settings

            monkeypatch.setattr(Settings, "_embed_model", Settings._embed_model)
        for b in chain:
            exec(compile(b.code, b.id, "exec"), namespace)
        return
    commands = _cli_lines(block.code)
    if not commands:
        pytest.fail(f"{block.id}: a bash block with no uibk-embed command: mark it "
                    "<!-- doc-test: skip REASON --> or make it runnable")
    for name in ("corpus.jsonl", "my-corpus.jsonl"):
        with open(tmp_path / name, "w", encoding="utf-8") as f:
            for i, t in enumerate(TEXTS):
                f.write(json.dumps({"id": f"d{i}", "text": t}) + "\n")
    for args in commands:
        r = subprocess.run([sys.executable, "-m", "uibk_embedding.apps.cli", *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{block.id}: uibk-embed {' '.join(args)}\n{r.stderr[-2000:]}"
