"""VectorFile: durable appends, uncommitted tails cut on open, generations, gather order."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.vectorfile import VectorFile, file_name, remove_other_generations


def _docs(rng, n):
    return [rng.normal(size=(int(rng.integers(1, 9)), 128)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_append_gather_and_reopen(tmp_path, dtype):
    rng = np.random.default_rng(0)
    docs = _docs(rng, 20)
    vf = VectorFile.open(tmp_path, generation=1, dtype=dtype, committed_rows=0)
    starts = np.concatenate([vf.append(docs[:7]), vf.append([]), vf.append(docs[7:])])
    lengths = np.array([len(d) for d in docs])
    order = rng.permutation(20)
    mat, off = vf.gather(starts[order], lengths[order])
    for j, i in enumerate(order):
        np.testing.assert_array_equal(mat[off[j]:off[j + 1]], docs[i].astype(dtype).astype(np.float32))
        np.testing.assert_array_equal(vf.read(starts[i], lengths[i]), mat[off[j]:off[j + 1]])
    committed = vf.n_rows
    vf.append(docs[:3])  # appended, never referenced by the owner: cut off on reopen
    vf.close()
    again = VectorFile.open(tmp_path, generation=1, dtype=dtype, committed_rows=committed)
    assert again.n_rows == committed
    assert (tmp_path / file_name(1, dtype)).stat().st_size == committed * 128 * np.dtype(dtype).itemsize
    mat2, off2 = again.gather(starts, lengths)
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(mat2[off2[i]:off2[i + 1]], d.astype(dtype).astype(np.float32))
    again.close()


def test_rewrite_keeps_only_live_documents(tmp_path):
    rng = np.random.default_rng(1)
    docs = _docs(rng, 10)
    vf = VectorFile.open(tmp_path, generation=1, dtype="float16", committed_rows=0)
    starts = vf.append(docs)
    lengths = np.array([len(d) for d in docs])
    live = np.array([1, 4, 9])
    new, new_starts = vf.rewrite(tmp_path, 2, starts[live], lengths[live], chunk_rows=5)
    assert new.n_rows == lengths[live].sum()
    for s, i in zip(new_starts, live, strict=True):
        np.testing.assert_array_equal(new.read(s, lengths[i]), docs[i].astype(np.float16).astype(np.float32))
    vf.close()
    remove_other_generations(tmp_path, keep=new.path.name)
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(2, "float16")]
    new.close()


def test_truncated_or_missing_file_is_refused(tmp_path):
    vf = VectorFile.open(tmp_path, generation=1, dtype="float32", committed_rows=0)
    vf.append([np.ones((4, 128), np.float32)])
    vf.close()
    with pytest.raises(ValueError, match="truncated"):
        VectorFile.open(tmp_path, generation=1, dtype="float32", committed_rows=5)
    with pytest.raises(FileNotFoundError, match="missing"):
        VectorFile.open(tmp_path, generation=2, dtype="float32", committed_rows=1)
    with pytest.raises(ValueError, match="dtype"):
        VectorFile.open(tmp_path, generation=1, dtype="int5", committed_rows=0)  # int8/4/3/2 are kinds now
    vf = VectorFile.open(tmp_path, generation=1, dtype="float32", committed_rows=4)
    with pytest.raises(ValueError, match="128 columns"):
        vf.append([np.ones((2, 64), np.float32)])
    assert vf.n_rows == 4
    vf.close()


def test_gather_in_the_file_dtype(tmp_path):
    """``dtype=`` returns the rows as stored (a rebuild hands float16 straight to the engine)."""
    rng = np.random.default_rng(2)
    docs = _docs(rng, 5)
    vf = VectorFile.open(tmp_path, generation=1, dtype="float16", committed_rows=0)
    starts = vf.append(docs)
    lengths = np.array([len(d) for d in docs])
    mat, off = vf.gather(starts[::-1], lengths[::-1], dtype=np.float16)
    assert mat.dtype == np.float16
    for j, d in enumerate(docs[::-1]):
        np.testing.assert_array_equal(mat[off[j]:off[j + 1]], d.astype(np.float16))
    assert vf.gather(starts[:0], lengths[:0], dtype=np.float16)[0].dtype == np.float16
    vf.close()
