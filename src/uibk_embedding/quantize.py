"""int8 rows: the scalar code of a tagged vector, 132 bytes where float32 takes 512.

One stored row of 128 dimensions becomes one record of :data:`QROW` (132 bytes):

* ``codes``: 128 int8 values. ``codes[0]`` is always 0; ``codes[1:]`` are the 127-d body
  divided by the row's scale and rounded to the nearest integer in ``[-127, 127]``;
* ``scale``: the row's scale, a float16 at or just above ``max |body| / 127`` (symmetric, per
  row);
* ``tag``: coordinate 0, the tag, as float16: exactly what a float16 store keeps of it.

The dequantised row is ``[tag ; scale * codes[1:]]``. Why the tag is apart: it is the largest
coordinate of every row (``-sqrt(1 - delta) = -0.88`` on slots, ``sqrt(1 - beta) = 0.32`` on
tokens; the body's largest is about 0.24), so a scale over all 128 coordinates would be set by
the tag and code the body 1.3-3.7x coarser. Kept as float16, every token row of every document
has the same tag, so ``C(q)`` of the score identity stays the same for every document
(docs/format.md#identity). Measured on Cranfield (277,428 rows, 100 queries, against float64
scores of the float16 rows): the body-only scale with the float16 tag gives recall@10 0.998 and
a mean score error of 0.0024; one scale over all 128 coordinates gives 0.996 and 0.0040.

The scale is a float16 on purpose: a code (at most 8 bits) times a float16 (11 significant bits)
is exact in float32, so the dequantised row is the same in float32 and float64, and the fused
kernel (which dequantises 8 codes at a time in registers, into its 24 KiB L1 buffer of 48 rows,
never a whole block) scores int8 rows bit for bit as it scores their float32 dequantisation
(``tests/test_quantize.py``).

Example
-------
>>> import numpy as np
>>> from uibk_embedding.tagged import TaggedFormat
>>> rows = TaggedFormat().build(np.ones((3, 127)), np.eye(2, 127))
>>> q = quantize(rows)
>>> q.dtype.itemsize, int(q["codes"][3, 1]), float(q["tag"][3]) == float(np.float16(rows[3, 0]))
(132, 127, True)
>>> float(np.abs(dequantize(q) - rows).max()) < 2e-3
True
"""

from __future__ import annotations

import numpy as np

DIM = 128
QROW = np.dtype([("codes", "i1", (DIM,)), ("scale", "<f2"), ("tag", "<f2")])
"""One int8 row: 128 codes (``codes[0]`` unused, 0), the float16 scale, the float16 tag."""
QMAX = 127


def quantize(rows: np.ndarray) -> np.ndarray:
    """``(n, 128)`` float rows as ``(n,)`` :data:`QROW` records (see the module docstring).

    >>> quantize(np.zeros((1, 128)))["scale"].tolist()   # an all-zero body keeps scale 0
    [0.0]
    """
    x = np.asarray(rows, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != DIM:
        raise ValueError(f"rows must be (n, {DIM}), got shape {x.shape}")
    peak = np.abs(x[:, 1:]).max(axis=1) if len(x) else np.zeros(0, np.float32)
    scale = (peak / QMAX).astype(np.float16)
    # rounded up where float16 rounding went below: no code leaves [-127, 127] by more than rounding
    low = scale.astype(np.float32) * QMAX < peak
    scale[low] = np.nextafter(scale[low], np.float16(np.inf))
    s = scale.astype(np.float32)
    out = np.zeros(len(x), QROW)
    safe = np.where(s > 0, s, 1.0).astype(np.float32)
    out["codes"][:, 1:] = np.clip(np.rint(x[:, 1:] / safe[:, None]), -QMAX, QMAX).astype(np.int8)
    out["scale"] = scale
    out["tag"] = x[:, 0].astype(np.float16)
    return out


def dequantize_into(q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The rows of :data:`QROW` records ``q`` written into ``out`` (``(len(q), 128)`` float32 or
    float64) and returned: ``[tag ; scale * codes[1:]]``, exact in either dtype."""
    np.multiply(q["codes"], q["scale"].astype(out.dtype)[:, None], out=out, casting="unsafe")
    out[:, 0] = q["tag"]
    return out


def dequantize(q: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """The rows of :data:`QROW` records ``q`` as a new ``(len(q), 128)`` array of ``dtype``."""
    return dequantize_into(q, np.empty((len(q), DIM), dtype=dtype))


def is_quantized(a: np.ndarray) -> bool:
    """Whether ``a`` holds :data:`QROW` records.

    >>> is_quantized(quantize(np.ones((1, 128)))), is_quantized(np.ones((1, 128)))
    (True, False)
    """
    return a.dtype == QROW


__all__ = ["QMAX", "QROW", "dequantize", "dequantize_into", "is_quantized", "quantize"]
