"""The memory budget of the local engines' builds reaches the engines' own knobs."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.indexed import default_memory_budget
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

FMT = TaggedFormat()


def _docs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [make_list(FMT, rng, int(rng.integers(4, 20))) for _ in range(n)]


def test_default_budget_is_half_the_vectors_within_bounds():
    assert default_memory_budget() == 2**28 and 2**28 <= default_memory_budget(2**40) <= 2**32


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1G", True])
def test_a_bad_budget_is_refused(tmp_path, bad):
    pytest.importorskip("fast_plaid")
    from uibk_embedding.plaid_backend.store import PlaidStore

    with pytest.raises((ValueError, TypeError), match="memory_budget"):
        PlaidStore(tmp_path / "p", memory_budget=bad)


def test_plaid_kmeans_tiles_follow_the_budget(tmp_path, monkeypatch):
    pytest.importorskip("fast_plaid")
    import fast_plaid.search.fast_plaid as fpm

    from uibk_embedding.plaid_backend.store import PlaidStore

    seen = []
    real = fpm.FastKMeans

    def recording(*a, **kw):
        seen.append(kw.get("chunk_size_data"))
        return real(*a, **kw)

    monkeypatch.setattr(fpm, "FastKMeans", recording)
    for budget, want in [(2**22, 1024), (2**40, 51_200)]:
        s = PlaidStore(tmp_path / str(budget), num_threads=1, memory_budget=budget, min_index_vectors=64)
        s.upsert([str(i) for i in range(60)], _docs(60))
        assert s.has_index
        s.close()
        assert seen[-1] == want
    assert fpm.FastKMeans is recording  # our patch is undone after each build


def test_warp_build_options_follow_the_budget(tmp_path, monkeypatch):
    pytest.importorskip("xtr_warp")
    from uibk_embedding.adapters.warp import WarpStore, warp_memory_options

    small, large = warp_memory_options(2**28), warp_memory_options(2**40)
    assert small["kmeans_sample_max_bytes"] == 2**26 and large["kmeans_sample_max_bytes"] == 2**31
    assert small["kmeans_data_chunk_size"] == 2048 and large["kmeans_data_chunk_size"] == 32768
    assert small["compression_batch_size"] == large["compression_batch_size"] == 256  # CPU: fixed
    assert warp_memory_options(2**28, "cuda")["compression_batch_size"] == 1024
    seen = {}
    s = WarpStore(tmp_path / "w", memory_budget=2**28, min_index_vectors=32)
    real = s._call

    def recording(what, fn, *a, **kw):
        if what == "create":
            seen.update(kw)
        return real(what, fn, *a, **kw)

    monkeypatch.setattr(s, "_call", recording)
    s.upsert([str(i) for i in range(60)], _docs(60))
    s.flush()
    assert s.has_index and {k: seen[k] for k in small} == small
    s.close()


def test_plaid_kmeans_sample_follows_the_budget(tmp_path, monkeypatch):
    pytest.importorskip("fast_plaid")
    from uibk_embedding.plaid_backend.store import PlaidStore, kmeans_sample_docs

    # the engine's rule below the budget; the budget's share above it; the floor of 64 vectors
    # per centroid over both
    assert kmeans_sample_docs(100, 5_000, 64, 2**30) == 100
    assert kmeans_sample_docs(10**6, 5 * 10**7, 2**15, 2**32) == 2**31 // (522 * 50)
    assert kmeans_sample_docs(10**6, 5 * 10**7, 2**16, 2**20) == -(-64 * 2**16 // 50)  # ceil
    seen = []
    s = PlaidStore(tmp_path / "p", num_threads=1, memory_budget=2**28, min_index_vectors=10**9)
    real = s._fp_mod.FastPlaid.create

    def recording(self, *a, **kw):
        seen.append(kw["n_samples_kmeans"])
        return real(self, *a, **kw)

    monkeypatch.setattr(s._fp_mod.FastPlaid, "create", recording)
    docs = _docs(60)
    s.upsert([str(i) for i in range(60)], docs)
    s.min_index_vectors = 1
    s.flush()
    assert s.has_index
    k = s._centroids()
    assert seen == [kmeans_sample_docs(60, sum(map(len, docs)), k, 2**28)] == [60]
    s.close()


_PROBE = r"""
import ctypes, sys
import numpy as np
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

engine, mode, path = sys.argv[1:4]
if mode != "import":
    if engine == "plaid":
        from uibk_embedding.plaid_backend.store import PlaidStore as Store
        options = {"num_threads": 1}
    else:
        from uibk_embedding.adapters.warp import WarpStore as Store
        options = {}
    rng = np.random.default_rng(len(mode))
    first = 0 if mode == "build" else 40
    s = Store(path, min_index_vectors=32, **options)
    had_index = s.has_index
    docs = [make_list(TaggedFormat(), rng, 8) for _ in range(40)]
    s.upsert([str(i) for i in range(first, first + 40)], docs)
    s.flush()
    assert s.has_index and had_index == (mode == "update")
    s.close()

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
for _ in range(2):  # a freed mmap block raises glibc's adaptive threshold above its size
    p = libc.malloc(4 << 20)
    libc.free(p)
p = libc.malloc(4 << 20)
# 1: this block is its own mmap, 0: it came from the heap. Read from the block itself: glibc sets
# bit 1 (IS_MMAPPED) of the size word just before it. (A count of all mmapped blocks, mallinfo2's
# hblks, before and after, also moved when an engine thread freed one in between: -1 was seen.)
print(ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value >> 1 & 1)
libc.free(p)
"""


@pytest.mark.parametrize("engine", ["plaid", "warp"])
@pytest.mark.parametrize("mode, env, mapped", [("build", {}, 1), ("update", {}, 1), ("import", {}, 0),
                                               ("build", {"UIBK_MALLOC_TUNING": "0"}, 0)])
def test_index_builds_and_updates_fix_the_mmap_threshold(tmp_path, engine, mode, env, mapped):
    """After an engine build or update (a store that already has an index, opened in a fresh
    process, takes more documents), a 4 MiB allocation is its own mmap (given back on free) even
    after glibc would have raised its threshold; without one, or opted out, it comes from the heap."""
    pytest.importorskip({"plaid": "fast_plaid", "warp": "xtr_warp"}[engine])
    import ctypes
    import os
    import platform
    import subprocess
    import sys

    if platform.system() != "Linux" or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc >= 2.33 only (mallinfo2)")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "UIBK_MALLOC"))}

    def probe(mode: str, env: dict) -> int:
        out = subprocess.run([sys.executable, "-c", _PROBE, engine, mode, str(tmp_path / "s")],
                             env={**base, **env}, check=True, capture_output=True, text=True).stdout
        return int(out.split()[-1])

    if mode == "update":  # the index is built in another process: this one only updates it
        probe("build", {})
    assert probe(mode, env) == mapped
