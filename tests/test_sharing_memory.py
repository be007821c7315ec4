"""What N readers of one store folder cost (issue 62): the store's data are mapped pages that the
readers share, not copies each reader keeps.

* The vector file (and an engine's mapped index files) of a store that two reader processes
  search is in both processes as shared clean pages of the page cache: no private copy.
* A store object holds no metadata (they may hold every document's text): they are read from
  SQLite for the documents an answer names; a reader whose snapshot lost a document to another
  writer meanwhile answers from the newer snapshot.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding._procmem import mappings, matching
from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.filters import parse_filter
from uibk_embedding.adapters.indexed import _StaleView
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

FMT = TaggedFormat()
LINUX = Path("/proc/self/smaps").exists()


def _docs(seed: int, n: int, rows: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, rows) for _ in range(n)]


READER = textwrap.dedent("""
    import importlib, json, sys
    import numpy as np
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list
    module, name, path, opts = json.loads(sys.argv[1])
    store = getattr(importlib.import_module(module), name)(path, read_only=True, **opts)
    q = make_list(TaggedFormat(), np.random.default_rng(9), 8)
    print(len(store.search(q, k=5)), flush=True)      # an exact scan reads every row
    sys.stdin.readline()                                # held open while the parent looks
""")


def _readers(module: str, name: str, path: Path, opts: dict, n: int = 2) -> list[subprocess.Popen]:
    args = [sys.executable, "-c", READER, json.dumps([module, name, str(path), opts])]
    procs = [subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(n)]
    for p in procs:
        line = p.stdout.readline()
        assert line.strip() == "5", p.stderr.read()[-2000:] if p.poll() is not None else line
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.communicate("\n", timeout=60)


@pytest.mark.skipif(not LINUX, reason="reads /proc/PID/smaps (Linux)")
def test_two_reader_processes_share_the_vector_file_pages(tmp_path):
    path = tmp_path / "s"
    with ExactStore(path) as w:  # float32 rows: 600 documents x 20 rows x 512 bytes = 6 MB
        w.upsert([f"d{i}" for i in range(600)], _docs(1, 600, 17))
        name = w._vf.path.name
        size = w._vf.path.stat().st_size
    procs = _readers("uibk_embedding.adapters.exact", "ExactStore", path, {})
    try:
        for p in procs:
            vec = matching(mappings(p.pid), name)
            # every row was read: resident, and shared with the other reader, never a private copy
            assert vec["Rss"] >= size * 0.9, vec
            assert vec["Shared_Clean"] == vec["Rss"], vec
            assert vec["Private_Dirty"] == vec["Private_Clean"] == 0, vec
            assert vec["Pss"] <= vec["Rss"] // 2 + 4096 * 4, vec  # divided between the two readers
    finally:
        _stop(procs)


@pytest.mark.skipif(not LINUX, reason="reads /proc/PID/smaps (Linux)")
def test_two_plaid_readers_share_the_mapped_index_files(tmp_path):
    pytest.importorskip("fast_plaid")
    path = tmp_path / "s"
    opts = {"nbits": 2, "kmeans_niters": 1, "num_threads": 1, "min_index_vectors": 64}
    from uibk_embedding.plaid_backend.store import PlaidStore

    with PlaidStore(path, **opts) as w:
        w.upsert([f"d{i}" for i in range(300)], _docs(2, 300, 17))
        assert w.has_index
        index = w._engine_folder
        vec_name = w._vf.path.name
    procs = _readers("uibk_embedding.plaid_backend.store", "PlaidStore", path, opts)
    try:
        for p in procs:
            usage = mappings(p.pid)
            mapped = [(n, f) for n, f in usage if n.startswith(str(index.resolve()) + "/")]
            assert {Path(n).name for n, _ in mapped} >= {"merged_codes.npy", "merged_residuals.npy"}
            for n, f in mapped:  # mapped, never written: no private copy of an index page
                assert f["Private_Dirty"] == 0, (n, f)
            vec = matching(usage, vec_name)
            assert vec["Private_Dirty"] == 0 and vec["Shared_Clean"] == vec["Rss"], vec
    finally:
        _stop(procs)


def test_a_reader_holds_no_metadata_in_memory(tmp_path):
    """Metadata of 200 KB per 20 documents (the documents' text, say) are not loaded by a reader:
    its open costs a small part of them in Python objects."""
    texts = [f"{i} " + "lorem ipsum " * 800 for i in range(200)]  # ~9.6 KB each, 1.9 MB in all
    with ExactStore(tmp_path / "s") as w:
        w.upsert([f"d{i}" for i in range(200)], _docs(3, 200, 4), [{"text": t} for t in texts])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        r = ExactStore(tmp_path / "s", read_only=True)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    try:
        assert held < 0.1 * sum(map(len, texts)), held
        hits = r.search(_docs(3, 200, 4)[42], k=2)  # the metadata of what an answer names
        assert hits[0].id == "d42" and hits[0].metadata == {"text": texts[42]}
        assert r.get(["d7"])[0].metadata == {"text": texts[7]}
        assert [md["text"][:3] for _, md in r.scan(filter={"text": {"$eq": texts[5]}})] == ["5 l"]
        assert [h.id for h in r.search(_docs(3, 200, 4)[5], k=3, filter={"text": texts[5]})] == ["d5"]
    finally:
        r.close()


def test_a_reader_whose_snapshot_lost_a_document_answers_from_the_newer_one(tmp_path):
    docs = _docs(4, 30)
    with ExactStore(tmp_path / "s") as w:
        w.upsert([f"d{i}" for i in range(30)], docs, [{"i": i} for i in range(30)])
        with ExactStore(tmp_path / "s", read_only=True) as r:
            assert r.count() == 30
            w.delete(["d3"])  # after the reader's snapshot
            # the reader's view (not refreshed) still ranks d3 first; its metadata row is gone
            stale = r._search_view([docs[3]], 1, (), 100, True, 100, False)
            assert stale[0][0].id == "d3"
            with pytest.raises(_StaleView):
                r._with_metadata(stale)
            with pytest.raises(_StaleView):
                r._matching(parse_filter({"i": {"$gte": 0}}))
            answer = r._reading(lambda: r._with_metadata(r._search_view([docs[3]], 2, (), 100, True, 100,
                                                                        False)))
            assert "d3" not in [h.id for h in answer[0]]
            assert [h.metadata["i"] for h in answer[0]] == [int(h.id[1:]) for h in answer[0]]
            assert r.count() == 29 and r.get(["d3"]) == []


def test_a_filter_keeps_only_the_fields_it_names_and_follows_new_writes(tmp_path):
    docs = _docs(5, 40)
    md = [{"lang": "en" if i % 2 else "de", "text": f"text {i} " * 50}
          | ({"draft": True} if i % 5 == 0 else {}) for i in range(40)]
    with ExactStore(tmp_path / "s") as w:
        w.upsert([f"d{i}" for i in range(30)], docs[:30], md[:30])
        with ExactStore(tmp_path / "s", read_only=True) as r:
            assert r._filter_fields is None
            q = docs[7]

            def check(filter) -> None:
                with ExactStore(tmp_path / "s", read_only=True) as fresh:
                    want = [(h.id, h.score, h.metadata) for h in fresh.search(q, k=40, filter=filter)]
                assert [(h.id, h.score, h.metadata) for h in r.search(q, k=40, filter=filter)] == want
                assert want

            check({"lang": "en"})
            fields, values = r._filter_fields
            assert fields == {"lang"} and all(set(v) == {"lang"} for v in values.values())  # no text kept
            w.upsert([f"d{i}" for i in range(30, 40)], docs[30:40], md[30:40])  # new documents
            w.delete(["d7", "d9"])
            w.upsert(["d11"], [docs[11]], [{"lang": "de"}])  # an overwrite: the new row's fields
            check({"lang": "en"})
            check({"$or": [{"draft": {"$exists": False}}, {"lang": {"$ne": "en"}}]})
            assert r._filter_fields[0] == {"draft", "lang"}


_SEARCH_PROBE = textwrap.dedent(r"""
    import ctypes, importlib, sys
    import numpy as np
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    module, name, path = sys.argv[1:4]
    store = getattr(importlib.import_module(module), name)(path, read_only=True)
    assert store.has_index
    store.search(make_list(TaggedFormat(), np.random.default_rng(3), 6), k=3)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
    for _ in range(2):  # a freed mmap block raises glibc's adaptive threshold above its size
        p = libc.malloc(4 << 20)
        libc.free(p)
    p = libc.malloc(4 << 20)
    # 1: this block is its own mmap (given back when freed), 0: it came from the heap (IS_MMAPPED,
    # bit 1 of the size word before the block)
    print(ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value >> 1 & 1)
""")


@pytest.mark.parametrize("engine", ["plaid", "warp"])
def test_a_reader_with_an_index_gives_large_search_buffers_back(tmp_path, engine):
    """A PLAID or WARP reader (read-only, a fresh process) that opened its index serves large
    allocations by mmap even after glibc would have raised its adaptive threshold, so a search's
    decompression buffers go back to the system when freed instead of staying in the reader
    (150-200 MiB a PLAID reader at NPL's size, benchmarks/results/reader_memory.md); with
    ``UIBK_MALLOC_TUNING=0`` they come from the heap (glibc's default)."""
    import ctypes
    import os
    import platform

    pytest.importorskip({"plaid": "fast_plaid", "warp": "xtr_warp"}[engine])
    if platform.system() != "Linux" or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc >= 2.33 only")
    from .test_sharing import MAKERS, _make

    with _make(engine, tmp_path / "s") as w:
        w.upsert([f"d{i}" for i in range(40)], _docs(1, 40))
        w.flush()
        assert w.has_index
    module, name, _ = MAKERS[engine]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "UIBK_MALLOC"))}

    def probe(env: dict) -> int:
        out = subprocess.run([sys.executable, "-c", _SEARCH_PROBE, module, name, str(tmp_path / "s")],
                             env={**base, **env}, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return int(out.stdout.split()[-1])

    assert probe({}) == 1
    assert probe({"UIBK_MALLOC_TUNING": "0"}) == 0
