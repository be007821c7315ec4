"""Quantized rows: int8 codes (132 bytes a row) and rotated 4/3/2-bit codes (68/52/36 bytes).

A stored row has 128 dimensions: coordinate 0 is the tag, 1..127 the body (DESIGN.md section 1).
Every code here keeps the tag apart, as float16: it is the largest coordinate of every row
(``-sqrt(1 - delta) = -0.88`` on slots, ``sqrt(1 - beta) = 0.32`` on tokens; the body's largest
is about 0.24), so a scale over all 128 coordinates would be set by the tag and code the body
1.3-3.7x coarser. Kept as float16, every token row of every document has the same tag, so
``C(q)`` of the score identity stays the same for every document (docs/format.md#identity), and
slots never become tokens: only the body is coded, slot rows and token rows alike.

**int8** (:data:`QROW`, 132 bytes; the ``int8`` and ``int8-rerank`` profiles):

* ``codes``: 128 int8 values. ``codes[0]`` is always 0; ``codes[1:]`` are the 127-d body
  divided by the row's scale and rounded to the nearest integer in ``[-127, 127]``;
* ``scale``: the row's scale, a float16 at or just above ``max |body| / 127`` (symmetric, per row);
* ``tag``: coordinate 0 as float16: exactly what a float16 store keeps of it.

The dequantised row is ``[tag ; scale * codes[1:]]``. Measured on Cranfield (277,428 rows, 100
queries, against float64 scores of the float16 rows): the body-only scale with the float16 tag
gives recall@10 0.998 and a mean score error of 0.0024; one scale over all 128 coordinates gives
0.996 and 0.0040.

**int4, int3, int2** (:func:`code_dtype`: ``16 * bits + 4`` bytes; ``compact`` is int4,
``exact-rerank`` int2): the body, padded with one zero to 128 values, is turned by the fixed
orthogonal matrix :data:`ROTATION` (a Walsh-Hadamard matrix times fixed signs, over sqrt(128):
a randomized Hadamard transform, as TurboQuant and RaBitQ-like schemes use; it spreads a row's
energy evenly, so no coordinate sets the scale alone), then each rotated value ``y`` is coded
as the nearest of ``2**bits`` levels ``scale * (c - h)``, ``c = 0 .. 2**bits - 1``,
``h = (2**bits - 1) / 2`` (no level at 0: every code is used), with the row's ``scale`` a float16
at or just above ``max |y| / h``, so no value is clipped and every value is within
``scale / 2`` of its level. Codes are packed 8 to ``bits`` bytes, code ``i`` of a group at bits
``bits * i`` of the group's little-endian integer (``codes`` field), then ``scale`` and ``tag``.

Scoring never rotates a row back: the rotation is orthogonal, so ``q . d`` equals the product of
the *scan rows* ``[q_tag ; R q_body]`` and ``[d_tag ; R d_body]`` (129 values:
:func:`scan_queries` turns each query once, :func:`scan_rows_into` decodes rows in that space).
:func:`dequantize` (``get``, ``explain``) rotates back.

**The score bound.** A coded row ``d~`` differs from its row ``d`` by ``e = d~ - d`` with
``|e_0| <= |tag| * 2**-11`` (float16 rounding; ``2**-25`` more where it is subnormal) and
``||e_body|| = ||R e_body|| <= sqrt(128) * scale / 2``. MaxSim is a sum over query rows of a
max, and a max of values each moved by at most ``b`` moves by at most ``b``, so by Cauchy-Schwarz

    |MaxSim(q, d~) - MaxSim(q, d)| <= sum over query rows i of
        ( |q_i,tag| * max_j |e_j,0| + ||q_i,body|| * max_j ||e_j,body|| )

(:func:`row_error_bound` gives each row's two terms from its record alone). The score identity
of DESIGN.md 1.2 then holds for the coded rows within that bound. Separation (no query token
picks a slot, no query slot a token) is guaranteed wherever twice one product's bound,
``2 (|q_tag| |e_0| + ||q_body|| ||e_body||)``, is below the worst-case margin ``0.55 - 0.17``
between a slot's match with a slot and with a token (paper Table 12); the bound is a worst case,
and on encoded text every code here keeps separation (tests/test_compact.py checks both).

The scale is a float16 on purpose: a code (at most 8 bits; ``c - h`` at most 5) times a float16
(11 significant bits) is exact in float32, so the decoded rows are the same in float32 and
float64, and the fused kernel (which decodes 8 codes at a time in registers, into its 24 KiB L1
buffer of 48 rows, never a whole block) scores coded rows bit for bit as it scores their float32
decoding (``tests/test_compact.py``).

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
>>> q4 = quantize(rows, "int4")
>>> q4.dtype.itemsize, code_of(q4.dtype), bool(np.all(dequantize(q4)[:, 0] == q["tag"]))
(68, 'int4', True)
>>> bool(np.linalg.norm(dequantize(q4) - rows, axis=1).max() <= row_error_bound(q4)[1].max())
True
"""

from __future__ import annotations

import numpy as np

DIM = 128
QROW = np.dtype([("codes", "i1", (DIM,)), ("scale", "<f2"), ("tag", "<f2")])
"""One int8 row: 128 codes (``codes[0]`` unused, 0), the float16 scale, the float16 tag."""
QMAX = 127
SCAN_DIM = DIM + 1
"""Width of a scan row of the rotated codes: the tag and the 128 rotated body values."""
CODE_BITS = {"int4": 4, "int3": 3, "int2": 2}
"""The rotated codes by name and their bits per value."""
CODES = ("int8", *CODE_BITS)
"""Every code :func:`quantize` writes."""
_SIGNS = 0x243F6A8885A308D313198A2E03707344  # 128 bits: the first hex digits of pi's fraction


def _rotation() -> np.ndarray:
    h = np.ones((1, 1))
    while len(h) < DIM:  # Sylvester's construction
        h = np.block([[h, h], [h, -h]])
    signs = np.array([-1.0 if (_SIGNS >> i) & 1 else 1.0 for i in range(DIM)])
    r = h * signs[None, :] / np.sqrt(DIM)
    r.setflags(write=False)
    return r


ROTATION = _rotation()
"""The fixed orthogonal ``128 x 128`` matrix of the rotated codes (float64): ``H diag(s) /
sqrt(128)``, ``H`` Sylvester's Walsh-Hadamard matrix, ``s`` the signs given by the bits of
``0x243F6A8885A308D313198A2E03707344`` (bit ``i`` set: ``s_i = -1``). Part of the format: a
store written with it is read with it."""


def code_dtype(code: str) -> np.dtype:
    """The record of one row of ``code`` (:data:`CODES`).

    >>> [code_dtype(c).itemsize for c in CODES]
    [132, 68, 52, 36]
    """
    if code == "int8":
        return QROW
    if code not in CODE_BITS:
        raise ValueError(f"code must be one of {', '.join(map(repr, CODES))}, got {code!r}")
    return _ROW_DTYPES[code]


_ROW_DTYPES = {c: np.dtype([("codes", "u1", (16 * b,)), ("scale", "<f2"), ("tag", "<f2")])
               for c, b in CODE_BITS.items()}
_BY_DTYPE = {QROW: "int8", **{dt: c for c, dt in _ROW_DTYPES.items()}}


def code_of(dtype: np.dtype) -> str | None:
    """The code whose records have ``dtype`` (:data:`CODES`), or None for plain float rows.

    >>> code_of(code_dtype("int2")), code_of(np.dtype(np.float32))
    ('int2', None)
    """
    return _BY_DTYPE.get(np.dtype(dtype))


def is_quantized(a: np.ndarray) -> bool:
    """Whether ``a`` holds coded rows (int8 or rotated records).

    >>> is_quantized(quantize(np.ones((1, 128)))), is_quantized(np.ones((1, 128)))
    (True, False)
    """
    return code_of(a.dtype) is not None


def quantize(rows: np.ndarray, code: str = "int8") -> np.ndarray:
    """``(n, 128)`` float rows as ``(n,)`` records of ``code`` (see the module docstring).

    >>> quantize(np.zeros((1, 128)))["scale"].tolist()   # an all-zero body keeps scale 0
    [0.0]
    """
    x = np.asarray(rows, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != DIM:
        raise ValueError(f"rows must be (n, {DIM}), got shape {x.shape}")
    if code != "int8":
        return _quantize_rotated(x, code)
    peak = np.abs(x[:, 1:]).max(axis=1) if len(x) else np.zeros(0, np.float32)
    s, scale = _scale(peak, QMAX)
    out = np.zeros(len(x), QROW)
    out["codes"][:, 1:] = np.clip(np.rint(x[:, 1:] / s[:, None]), -QMAX, QMAX).astype(np.int8)
    out["scale"] = scale
    out["tag"] = x[:, 0].astype(np.float16)
    return out


def _scale(peak: np.ndarray, levels: float) -> tuple[np.ndarray, np.ndarray]:
    """The float16 scale at or just above ``peak / levels`` and its divisor (1 where it is 0)."""
    scale = (peak / levels).astype(np.float16)
    # rounded up where float16 rounding went below: no code leaves its range by more than rounding
    low = scale.astype(peak.dtype) * levels < peak
    scale[low] = np.nextafter(scale[low], np.float16(np.inf))
    s = scale.astype(peak.dtype)
    return np.where(s > 0, s, 1.0).astype(peak.dtype), scale


def _quantize_rotated(x: np.ndarray, code: str) -> np.ndarray:
    dt = code_dtype(code)
    bits = CODE_BITS[code]
    top = (1 << bits) - 1
    half = top / 2
    body = np.zeros((len(x), DIM), np.float64)
    body[:, :DIM - 1] = x[:, 1:]
    y = body @ ROTATION.T
    peak = np.abs(y).max(axis=1) if len(x) else np.zeros(0)
    s, scale = _scale(peak, half)
    c = np.clip(np.floor(y / s[:, None] + half + 0.5), 0, top).astype(np.uint32)  # the nearest level
    out = np.zeros(len(x), dt)
    out["codes"] = _pack(c, bits)
    out["scale"] = scale
    out["tag"] = x[:, 0].astype(np.float16)
    return out


def _pack(c: np.ndarray, bits: int) -> np.ndarray:
    """``(n, 128)`` codes below ``2**bits`` packed 8 to ``bits`` bytes (little-endian groups)."""
    groups = c.reshape(len(c), DIM // 8, 8)
    words = (groups << (bits * np.arange(8, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
    return words.astype("<u4").view(np.uint8).reshape(len(c), DIM // 8, 4)[:, :, :bits].reshape(len(c), -1)


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The ``(n, 128)`` codes of :func:`_pack`'s bytes."""
    n = len(packed)
    words = np.zeros((n, DIM // 8, 4), np.uint8)
    words[:, :, :bits] = packed.reshape(n, DIM // 8, bits)
    w = words.view("<u4").reshape(n, DIM // 8, 1)
    return ((w >> (bits * np.arange(8, dtype=np.uint32))) & ((1 << bits) - 1)).reshape(n, DIM)


def scan_dim(dtype: np.dtype) -> int:
    """How many values a scanned row of ``dtype`` has: 129 for the rotated codes, else 128."""
    return SCAN_DIM if code_of(dtype) in CODE_BITS else DIM


def scan_queries(qmat: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The query rows ``qmat`` (``(m, 128)``) as the rows of ``dtype`` are scanned: unchanged for
    float and int8 rows, ``[tag ; R body]`` (``(m, 129)``, in ``qmat``'s dtype) for the rotated
    codes, so that their products are the original products (up to rounding)."""
    if code_of(dtype) not in CODE_BITS:
        return qmat
    if qmat.ndim != 2 or qmat.shape[1] != DIM:
        raise ValueError(f"query vectors have {qmat.shape[1]} dimensions, documents {DIM}")
    out = np.empty((len(qmat), SCAN_DIM), dtype=qmat.dtype)
    out[:, 0] = qmat[:, 0]
    out[:, 1:] = qmat[:, 1:].astype(np.float64) @ ROTATION[:, :DIM - 1].T
    return out


def scan_rows_into(q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The records ``q`` decoded into ``out`` as they are scanned (:func:`scan_dim` wide,
    float32 or float64; the rotated codes stay rotated) and returned; exact in either dtype, the
    values the fused kernel computes."""
    code = code_of(q.dtype)
    if code == "int8":
        return dequantize_into(q, out)
    bits = CODE_BITS[code]
    np.subtract(_unpack(q["codes"], bits), ((1 << bits) - 1) / 2, out=out[:, 1:], casting="unsafe")
    out[:, 1:] *= q["scale"].astype(out.dtype)[:, None]
    out[:, 0] = q["tag"]
    return out


def dequantize_into(q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The rows of records ``q`` written into ``out`` (``(len(q), 128)`` float32 or float64) and
    returned: int8 ``[tag ; scale * codes[1:]]``, exact in either dtype; rotated codes turned back
    (``[tag ; R^T y]`` of the decoded ``y``: float rounding of the rotation)."""
    if code_of(q.dtype) == "int8":
        np.multiply(q["codes"], q["scale"].astype(out.dtype)[:, None], out=out, casting="unsafe")
        out[:, 0] = q["tag"]
        return out
    scan = scan_rows_into(q, np.empty((len(q), SCAN_DIM), np.float64))
    out[:, 0] = scan[:, 0]
    out[:, 1:] = scan[:, 1:] @ ROTATION[:, :DIM - 1]
    return out


def dequantize(q: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """The rows of records ``q`` as a new ``(len(q), 128)`` array of ``dtype``."""
    return dequantize_into(q, np.empty((len(q), DIM), dtype=dtype))


def row_error_bound(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of records ``q``: bounds on how far its decoded tag and body lie from the row it
    was quantised from (``|e_0|``, ``||e_body||``; the module docstring's score bound): float16
    rounding of the tag, half a step per coded value.

    >>> q = quantize(np.full((1, 128), 0.08), "int2")
    >>> t, b = row_error_bound(q)
    >>> float(t[0]) < 1e-4, float(b[0]) == float(np.sqrt(128) * q["scale"][0]) / 2
    (True, True)
    """
    scale = q["scale"].astype(np.float64)
    # float16 rounding: relative 2**-11 (of |t|, so slightly more of the stored |t~|), and at most
    # 2**-25 where the tag is subnormal
    tag = np.abs(q["tag"].astype(np.float64)) * (2.0 ** -11 * (1 + 2.0 ** -10)) + 2.0 ** -25
    values = DIM - 1 if code_of(q.dtype) == "int8" else DIM
    return tag, np.sqrt(values) * scale / 2


__all__ = ["CODES", "CODE_BITS", "DIM", "QMAX", "QROW", "ROTATION", "SCAN_DIM", "code_dtype", "code_of",
           "dequantize", "dequantize_into", "is_quantized", "quantize", "row_error_bound", "scan_dim",
           "scan_queries", "scan_rows_into"]
