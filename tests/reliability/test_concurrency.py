"""One writer upserting and deleting while reader threads search: no exception, and every result
(of an exact backend) equals the collection after some prefix of the writes, with each reader's
prefixes never going backwards. The encoder under concurrent callers returns each its own vectors.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from uibk_embedding.encoder.tagged import TaggedFormat
from uibk_embedding.testing import make_list

N_OPS = 30
N_READERS = 3


def _ops() -> list[tuple[str, str]]:
    ops = []
    for i in range(N_OPS):
        ops.append(("upsert", f"w{i}"))
        if i % 3 == 2:
            ops.append(("delete", f"w{i - 2}"))
    return ops


def _states(ops) -> list[frozenset[str]]:
    live: set[str] = set()
    states = [frozenset()]
    for kind, x in ops:
        live.add(x) if kind == "upsert" else live.discard(x)
        states.append(frozenset(live))
    return states


def test_readers_see_prefixes_while_one_writer_writes(spec, tmp_path):
    store = spec.make(tmp_path)
    fmt = TaggedFormat()
    rng = np.random.default_rng(11)
    ops = _ops()
    vecs = {x: make_list(fmt, rng, 6) for kind, x in ops if kind == "upsert"}
    query = make_list(fmt, rng, 5)
    states = _states(ops)
    index_of = {s: i for i, s in enumerate(states)}
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[list[frozenset[str]]] = [[] for _ in range(N_READERS)]

    def writer():
        try:
            for kind, x in ops:
                if kind == "upsert":
                    store.upsert([x], [vecs[x]], [{"op": x}])
                else:
                    store.delete([x])
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def reader(r: int):
        try:
            while not done.is_set():
                hits = store.search(query, k=100)
                seen[r].append(frozenset(h.id for h in hits))
            seen[r].append(frozenset(h.id for h in store.search(query, k=100)))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader, args=(r,)) for r in range(N_READERS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not errors, f"{spec.name}: {errors[0]!r}"
        assert store.count() == len(states[-1])
        ever = set(vecs)
        for r in range(N_READERS):
            assert seen[r], "reader never ran"
            if spec.contract == "exact":
                prefixes = [index_of.get(s) for s in seen[r]]
                assert None not in prefixes, f"{spec.name}: a result matches no prefix of the writes"
                assert prefixes == sorted(prefixes), f"{spec.name}: a reader went back in time"
                assert prefixes[-1] == len(states) - 1
            else:
                assert all(s <= ever for s in seen[r])
    finally:
        store.close()


def test_encoder_concurrent_callers_get_their_own_vectors(encoder):
    texts = [[f"caller {c} text {i} about wings and flutter" for i in range(6)] for c in range(4)]
    expected = [encoder.encode_documents(t) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: encoder.encode_documents(t, show_progress=False), texts))
    for e, g in zip(expected, got, strict=True):  # the same batch of texts: the same bytes
        for a, b in zip(e, g, strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("n_threads", [4])
def test_concurrent_upserts_of_distinct_ids(spec, tmp_path, n_threads):
    """Several writers at once: every acknowledged upsert is there afterwards."""
    store = spec.make(tmp_path)
    fmt = TaggedFormat()
    try:
        def write(t: int):
            rng = np.random.default_rng(t)
            for i in range(5):
                store.upsert([f"t{t}-{i}"], [make_list(fmt, rng, 5)])

        with ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(write, range(n_threads)))
        assert store.count() == n_threads * 5
        assert len(store.get([f"t{t}-{i}" for t in range(n_threads) for i in range(5)])) == n_threads * 5
    finally:
        store.close()
