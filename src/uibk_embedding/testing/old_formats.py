"""Folders as older versions of the exact store wrote them, for the conversion tests.

0.4 and older kept an operation log: ``store.json``, ``snapshot-*.npz`` and ``ops/NNN.npz``
(0.3.0 with the vectors inside the ``.npz`` files, later beside them in a vector file).
:class:`~uibk_embedding.adapters.exact.ExactStore` converts such a folder when it opens it.

>>> import tempfile, pathlib, numpy as np
>>> from uibk_embedding.adapters.exact import ExactStore
>>> d = pathlib.Path(tempfile.mkdtemp()) / "s"
>>> docs = [np.full((4, 128), i, np.float32) for i in range(6)]
>>> _ = write_exact_store_04(d, ["a", "b", "c", "b", "e", "f"], docs, [{}] * 6)
>>> sorted(p.name for p in d.iterdir())
['ops', 'snapshot-000000000002.npz', 'store.json', 'vectors-000001.f32']
>>> ExactStore(path=d).ids()
['c', 'b', 'e', 'f']
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from uibk_embedding.tagged import TaggedFormat


def write_exact_store_030(path: Path, ids: list[str], docs: list[np.ndarray], metadata: list[dict],
                          format: TaggedFormat | None = None) -> None:
    """The files 0.3.0 wrote: ``store.json`` without a vector dtype, a snapshot holding the
    first three documents' vectors, an operation holding the rest, and a delete of ``ids[1]``."""
    path.mkdir()
    (path / "ops").mkdir()
    config = {"backend": "exact", "version": 1, "format": (format or TaggedFormat()).to_stored()}
    (path / "store.json").write_text(json.dumps(config))

    def arrays(ids, docs, md):
        return {"ids": np.array(json.dumps(ids)), "metadata": np.array(json.dumps(md)),
                "lengths": np.array([len(d) for d in docs], np.int64),
                "vectors": np.concatenate(docs).astype(np.float32)}

    np.savez(path / "snapshot-000000000002.npz", **arrays(ids[:3], docs[:3], metadata[:3]))
    np.savez(path / "ops" / "000000000003.npz", op=np.array("upsert"),
             **arrays(ids[3:], docs[3:], metadata[3:]))
    np.savez(path / "ops" / "000000000004.npz", op=np.array("delete"), ids=np.array(json.dumps([ids[1]])))


def write_exact_store_04(path: Path, ids: list[str], docs: list[np.ndarray], metadata: list[dict],
                         dtype: str = "float32", format: TaggedFormat | None = None) -> list[np.ndarray]:
    """The files 0.4 wrote: ``store.json`` (version 2), the vector file, a snapshot of the first
    three documents, an operation (already folded into it) deleting an id never stored, an upsert
    of the rest whose rows start after an unacknowledged gap, a delete of ``ids[0]``, and an
    unacknowledged tail of rows. Returns the rows as stored (in ``dtype``)."""
    path.mkdir()
    (path / "ops").mkdir()
    (path / "store.json").write_text(json.dumps({"backend": "exact", "version": 2, "vector_dtype": dtype,
                                                 "format": (format or TaggedFormat()).to_stored()}))
    rows = [np.asarray(d).astype(dtype) for d in docs]
    gap = np.ones((2, 128), dtype)  # rows of a write that died before its operation file
    with open(path / f"vectors-000001.f{dtype[-2:]}", "wb") as f:
        for block in (*rows[:3], gap, *rows[3:], gap):
            f.write(block.tobytes())
    lengths = [len(d) for d in docs]
    np.savez(path / "snapshot-000000000002.npz", ids=np.array(json.dumps(ids[:3])),
             metadata=np.array(json.dumps(metadata[:3])), lengths=np.array(lengths[:3]),
             alive=np.ones(3, bool), vector_gen=np.array(1), vector_rows=np.array(sum(lengths[:3])))
    np.savez(path / "ops" / "000000000001.npz", op=np.array("delete"), ids=np.array(json.dumps(["old"])))
    np.savez(path / "ops" / "000000000003.npz", op=np.array("upsert"), ids=np.array(json.dumps(ids[3:])),
             metadata=np.array(json.dumps(metadata[3:])), start=np.array(sum(lengths[:3]) + 2),
             lengths=np.array(lengths[3:]))
    np.savez(path / "ops" / "000000000004.npz", op=np.array("delete"), ids=np.array(json.dumps([ids[0]])))
    return rows


__all__ = ["write_exact_store_030", "write_exact_store_04"]
