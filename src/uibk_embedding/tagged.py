"""The tagged multi-vector format of UIBK-Embedding (docs/format.md).

Every text becomes ONE list of 128-d unit vectors: ``n_slots`` (3) *slot* vectors that carry
a dense sentence embedding, then ColBERT-style *token* vectors. Coordinate 0 is the tag:

* token  ``v_t = [+sqrt(1 - beta) ; sqrt(beta)  * u_t]``   (``u_t`` a unit 127-d vector)
* slot   ``v_s = [-sqrt(1 - delta); sqrt(delta) * g_s]``   (``delta = lambda * beta / 3``)

so that plain MaxSim over two lists equals ``C(q) + beta * (token MaxSim + lambda * dense)``
whenever tokens select tokens and slot ``s`` selects slot ``s``. :func:`decompose` computes the
parts from the pairs MaxSim actually selected, so a hit can be explained even when that
assumption fails.

Example
-------
>>> import numpy as np
>>> fmt = TaggedFormat()
>>> round(fmt.delta, 3)
0.225
>>> rng = np.random.default_rng(0)
>>> q = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(5, 127)))
>>> d = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(9, 127)))
>>> q.shape, d.shape
((8, 128), (12, 128))
>>> parts = decompose(q, d, fmt)
>>> bool(abs(parts.total - (parts.constant + fmt.beta * (parts.token
...      + fmt.lambda_ * parts.dense_weight * parts.dense))) < 1e-5)
True
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np

from uibk_embedding.errors import InvalidInput

DIM = 128
BODY = DIM - 1
N_SLOTS = 3

#: ``TaggedFormat.projection`` of a store written before stores recorded the encoder's
#: projection (uibk-embedding 0.1.0, when every encoder used its seeded random matrices).
UNRECORDED = "unrecorded"


#: a numpy array or a torch tensor: the layout below is written with operators both have
Rows = TypeVar("Rows")


def _row_norms(x: np.ndarray, what: str) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    if np.any(norms == 0) or not np.all(np.isfinite(norms)):
        raise ValueError(f"{what}: cannot normalise a zero or non-finite vector")
    return norms


def tag_rows(out: Rows, body: Any, norms: Any, tag: float, scale: float) -> Rows:
    """Write tagged rows into ``out`` ``(..., 128)`` and return it: coordinate 0 is ``tag``, the
    rest is ``body`` ``(..., 127)`` divided by its row ``norms`` (kept axis) and scaled by
    ``sqrt(scale)``. THE layout of a tagged row, written with operators that numpy arrays and
    torch tensors share, so :meth:`TaggedFormat.build` (numpy, float64) and the encoders'
    batched construction on the model's device (torch, :mod:`uibk_embedding.encoder.pipeline`)
    are one definition. The caller computes ``norms`` and decides what a zero norm does
    (``build`` refuses it; the device construction makes the row NaN and refuses it later).

    >>> x = np.array([[3.0, 4.0]])
    >>> tag_rows(np.empty((1, 3)), x, np.linalg.norm(x, axis=-1, keepdims=True), -0.5, 0.25).tolist()
    [[-0.5, 0.30000000000000004, 0.4]]
    """
    out[..., 0] = tag  # type: ignore[index]
    out[..., 1:] = body * (math.sqrt(scale) / norms)  # type: ignore[index]
    return out


def check_text(text: str, where: str) -> str:
    """``text``, if every engine can store it: valid Unicode, encodable as UTF-8 (no lone
    surrogate such as ``"\\ud800"``, which Python strings allow); else :class:`InvalidInput`.

    >>> check_text("ünïcödé 日本", "ids[0]")
    'ünïcödé 日本'
    >>> check_text("x\\ud800", "ids[0]")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.InvalidInput: ids[0] is not valid Unicode: a lone surrogate '\\ud800' at ...
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInput(f"{where} is not valid Unicode: a lone surrogate {text[e.start]!r} at "
                           f"character {e.start} (text must be encodable as UTF-8)") from None
    return text


TAG_RTOL = 0.008
"""How far (relative) a row's tag may be from the store format's tag (``sqrt(1 - beta)`` for a
token row, ``-sqrt(1 - delta)`` per unit norm for a slot row) and still be that format's
(:func:`check_format_tags`). Derived from the coarsest dtype a list may have passed through,
bfloat16 (a model run on a GPU; float16, what stores may keep rows in, is 8 times finer): 8
significant bits, so rounding to nearest moves a value by at most half a unit in the last place,
2**-8 of it (the token tag 0.3162 of the released format lies in [0.25, 0.5), whose spacing is
2**-9: at most 2**-10 = 0.00098, 0.31% of it; the slot tag 0.8803 at most 2**-9 = 0.0020, 0.22%).
A tag is rounded once, and is then divided by a norm at most 2**-8 off (a row normalised after
rounding, or a query's slot tag over its row's norm): 2 * 2**-8 = 2**-7 = 0.0078 to first order,
0.008 with the second-order term and float32 arithmetic. What it tells apart: at the released
format, beta from 0.8984 to 0.9016 reads as 0.9 (the token tag moves by |d beta| / (2 (1 - beta))
relative), and a lambda 0.05 away (slot tag 0.97% away) is refused; formats closer than that
are not told apart. A PyLate folder's probe snaps its constants to the 0.05 grid only within
half of it (:func:`~uibk_embedding.encoder.pylate_model.probe_format`)."""
MAX_POOL_FACTOR = 64
"""The largest token pool factor (:mod:`uibk_embedding.token_pooling`): past it a document of the
2048 tokens a document is read to keeps at most 32 token vectors (PyLate's users pool by 2 to 4)."""
POOL_METHODS = ("content", "ward")
"""How :mod:`~uibk_embedding.token_pooling` merges a document's token rows: ``"content"`` (the
default since 0.5: function tokens out, the content average-linked inside segments) or
``"ward"`` (Ward's clustering of every token row, PyLate's ``pool_factor``; what stores pooled
before 0.5 recorded no method and hold it)."""
MAX_DENSE_WEIGHT = 1e6
"""The largest dense weight: past it the weighted slots overflow float32 (from about 1e38) long
before, at float32's 7 digits, the dense part has drowned the token part of every score."""


def check_dense_weight(w: Any) -> float:
    """The query-time dense weight ``w`` as a float; a ``ValueError`` unless it is a positive
    finite real number up to :data:`MAX_DENSE_WEIGHT` (a bool is not a weight). Every encoder,
    the integrations and the tagged construction check a weight with this function.

    >>> check_dense_weight(2)
    2.0
    >>> check_dense_weight(float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: dense_weight must be a positive finite number, got nan
    """
    if (isinstance(w, bool | np.bool_) or not isinstance(w, numbers.Real) or not math.isfinite(w)
            or w <= 0):
        raise ValueError(f"dense_weight must be a positive finite number, got {w!r}")
    if w > MAX_DENSE_WEIGHT:
        raise ValueError(f"dense_weight must be at most {MAX_DENSE_WEIGHT:g}, got {w!r} (the weighted "
                         "dense rows would overflow float32)")
    return float(w)


def apply_dense_weight(slots: Rows, w: Any) -> Rows:
    """Scale query slot rows by the dense weight ``w``, in place, and return them (a numpy array
    or a torch tensor, ``(..., 128)``, slot rows only). ``w``: one weight (a weight of 1 leaves
    the rows as they are), or an array of one weight per leading index (shape
    ``slots.shape[:w.ndim]``: per list, or per row), taken in the rows' dtype and device. Every
    weight is checked (:func:`check_dense_weight`). The one place a dense weight is applied.

    >>> s = apply_dense_weight(np.ones((2, 3, 128)), np.array([1.0, 2.0]))
    >>> s[:, :, 0].tolist()
    [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    >>> apply_dense_weight(np.ones((3, 128)), 0)
    Traceback (most recent call last):
    ...
    ValueError: dense_weight must be a positive finite number, got 0
    """
    if np.ndim(w) == 0:
        w = check_dense_weight(w.item() if isinstance(w, np.ndarray) else w)
        if w != 1.0:
            slots *= w  # type: ignore[operator]
        return slots
    weights = np.asarray(w, dtype=np.float64)
    bad = ~(np.isfinite(weights) & (weights > 0))
    if bad.any():
        check_dense_weight(float(weights[bad].flat[0]))  # raises, naming the first bad weight
    shape = weights.shape + (1,) * (slots.ndim - weights.ndim)  # type: ignore[attr-defined]
    if isinstance(slots, np.ndarray):
        slots *= weights.reshape(shape)
    else:  # a torch tensor (torch is imported only by whoever made it)
        import torch

        slots *= torch.from_numpy(weights).to(slots.device, dtype=slots.dtype).reshape(shape)  # type: ignore[attr-defined,operator]
    return slots


@dataclass(frozen=True)
class Bounds:
    """Worst-case similarity bounds of a format (paper Table 12).

    ``slot_slot_min``: the lowest a slot-slot product can be; ``slot_token_max``: the highest a
    slot-token product can be (query slot vs document token, or the reverse). Property (i),
    "a query slot always selects a document slot", holds when ``slot_slot_min > slot_token_max``.

    >>> b = TaggedFormat().bounds()
    >>> round(b.slot_slot_min, 2), round(b.slot_token_max, 2), b.property_i
    (0.55, 0.17, True)
    """

    beta: float
    lambda_: float
    delta: float
    slot_slot_min: float
    slot_token_max: float
    token_token_min: float
    property_i: bool

    def as_dict(self) -> dict[str, float | bool]:
        return asdict(self)


def compute_bounds(beta: float, lambda_: float) -> Bounds:
    """Bounds of docs/format.md#identity for any ``beta`` in (0, 1) and ``lambda_ > 0`` (no validation).

    >>> compute_bounds(0.9, 1.5).property_i
    False
    """
    delta = lambda_ * beta / N_SLOTS
    slot_slot = (1 - delta) - delta  # tags multiply to (1 - delta), bodies >= -delta
    slot_token = math.sqrt(beta * delta) - math.sqrt((1 - beta) * max(1 - delta, 0.0))
    token_token = (1 - beta) - beta
    return Bounds(
        beta=beta,
        lambda_=lambda_,
        delta=delta,
        slot_slot_min=slot_slot,
        slot_token_max=slot_token,
        token_token_min=token_token,
        property_i=bool(slot_slot > slot_token),
    )


@dataclass(frozen=True)
class TaggedFormat:
    """Constants of the tagged format, validated against the bounds of docs/format.md#identity.

    Parameters
    ----------
    beta:
        Weight of the body against the tag, in (0, 1). Released value 0.9.
    lambda_:
        Weight of the dense part relative to the token part. Released value 0.75. A value
        for which property (i) fails (a query slot could prefer a document token over every
        document slot) is refused with the reason.
    projection:
        Which fixed matrices ``R`` and ``P`` made the lists (``"<kind>-<content hash>"``, set
        by the encoder; ``None``: not declared). Not part of the arithmetic, but a store
        records it and refuses an encoder with another one: a query projected with another
        ``P`` does not match the stored token vectors (see :meth:`conflict`).
    pool_factor:
        Token pooling at index time (:mod:`uibk_embedding.token_pooling`): a document's ``n``
        token rows are merged into ``max(n // pool_factor, 1)``; 1 (the default) is off. Queries
        are never pooled. Not part of the arithmetic either, and not of :meth:`conflict` (any
        encoder of the same constants searches a pooled store), but a store records it and the
        paths that write an encoder's documents refuse another one
        (:func:`~uibk_embedding.token_pooling.check_pool_factor`). A record without it: 1.
    pool_method:
        How documents are pooled, one of :data:`POOL_METHODS` (docs/format.md#pooling):
        ``"content"`` (the default) or ``"ward"``. Only meaningful with ``pool_factor > 1`` (at 1
        it reads ``"content"`` whatever was given); a record of a pooled store without it:
        ``"ward"``, the only method before 0.5. Recorded and checked like the pool factor.
    pool_frequent_ids:
        Token ids the ``"content"`` method treats as function words besides its stopword list:
        the ids found in at least 90% of the collection's documents (a statistic of the corpus,
        :func:`~uibk_embedding.token_pooling.frequent_token_ids`; set by
        ``encoder.fit_pooling(texts)`` or ``uibk-embed index``). Sorted, unique; empty: none.
        Recorded and checked like the pool factor.

    >>> TaggedFormat(lambda_=1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: lambda_=1.5 breaks property (i) of docs/format.md#identity: ...
    """

    beta: float = 0.9
    lambda_: float = 0.75
    n_slots: int = N_SLOTS
    projection: str | None = None
    pool_factor: int = 1
    pool_method: str = "content"
    pool_frequent_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.pool_method not in POOL_METHODS:
            raise ValueError(f"pool_method must be one of {POOL_METHODS}, got {self.pool_method!r}")
        ids = self.pool_frequent_ids
        whole = (lambda i: isinstance(i, int | np.integer) and not isinstance(i, bool) and i >= 0)  # noqa: E731
        if not isinstance(ids, tuple | list) or not all(whole(i) for i in ids):
            raise ValueError(f"pool_frequent_ids must be token ids (whole numbers >= 0), got {ids!r}")
        object.__setattr__(self, "pool_frequent_ids", tuple(sorted({int(i) for i in ids})))
        if self.pool_factor == 1 or self.pool_method == "ward":  # nothing pooled, or ids unused
            object.__setattr__(self, "pool_frequent_ids", ())
        if self.pool_factor == 1:
            object.__setattr__(self, "pool_method", "content")
        if not (isinstance(self.beta, int | float) and 0 < self.beta < 1):
            raise ValueError(f"beta must be a number in (0, 1), got {self.beta!r}")
        if not (isinstance(self.lambda_, int | float) and math.isfinite(self.lambda_) and self.lambda_ > 0):
            raise ValueError(f"lambda_ must be a positive finite number, got {self.lambda_!r}")
        if self.projection is not None and not (isinstance(self.projection, str) and self.projection):
            raise ValueError(f"projection must be a non-empty string or None, got {self.projection!r}")
        if (isinstance(self.pool_factor, bool) or not isinstance(self.pool_factor, int)
                or not 1 <= self.pool_factor <= MAX_POOL_FACTOR):
            raise ValueError(f"pool_factor must be a whole number from 1 (no pooling) to "
                             f"{MAX_POOL_FACTOR}, got {self.pool_factor!r}")
        if self.n_slots != N_SLOTS:
            raise ValueError(f"the format has exactly {N_SLOTS} slots, got n_slots={self.n_slots}")
        b = self.bounds()
        if not b.property_i:
            # the largest lambda keeping (i) at this beta: slot-slot minus slot-token,
            # 1 - 2 delta - sqrt(beta delta) + sqrt((1 - beta)(1 - delta)), falls with delta from
            # 1 + sqrt(1 - beta) at 0 to -1 - sqrt(beta) at delta = 1 (lambda = 3 / beta), where
            # (i) fails for good: the one root lies below min(lambda_, 3 / beta)
            lo, hi = 0.0, min(self.lambda_, self.n_slots / self.beta)
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if compute_bounds(self.beta, mid).property_i else (lo, mid)
            raise ValueError(
                f"lambda_={self.lambda_} breaks property (i) of docs/format.md#identity: slot-slot "
                f"similarity can drop to {b.slot_slot_min:.3f} while slot-token similarity can reach "
                f"{b.slot_token_max:.3f}, so a query slot could select a document token; "
                f"use lambda_ <= {math.floor(lo * 1000) / 1000:g} with beta={self.beta:g}"
            )

    # -- constants -------------------------------------------------------------------------
    @property
    def delta(self) -> float:
        return self.lambda_ * self.beta / self.n_slots

    @property
    def token_tag(self) -> float:
        return math.sqrt(1 - self.beta)

    @property
    def slot_tag(self) -> float:
        return -math.sqrt(1 - self.delta)

    def bounds(self) -> Bounds:
        return compute_bounds(self.beta, self.lambda_)

    def constant(self, n_query_tokens: int, dense_weight: float = 1.0) -> float:
        """``C(q) = m (1 - beta) + 3 w (1 - delta)``: the part of MaxSim that is the same for
        every document (``m`` query tokens, query slots scaled by ``w``).

        >>> round(TaggedFormat().constant(10), 3)
        3.325
        """
        return n_query_tokens * (1 - self.beta) + self.n_slots * dense_weight * (1 - self.delta)

    def to_dict(self) -> dict[str, float]:
        """The constants (what an encoder's configuration records), and the pooling when
        documents are pooled (so an unpooled format's record is what it was before pooling).

        >>> TaggedFormat(pool_factor=2).to_dict()
        {'beta': 0.9, 'lambda_': 0.75, 'n_slots': 3, 'pool_factor': 2, 'pool_method': 'content'}
        """
        d: dict[str, Any] = {"beta": self.beta, "lambda_": self.lambda_, "n_slots": self.n_slots}
        if self.pool_factor != 1:
            d["pool_factor"] = self.pool_factor
            d["pool_method"] = self.pool_method
            if self.pool_frequent_ids:
                d["pool_frequent_ids"] = list(self.pool_frequent_ids)
        return d

    def to_stored(self) -> dict[str, Any]:
        """What a store records: the constants and the projection (``None`` written out, so
        that a store opened without an encoder's format is told apart from one written
        before projections were recorded, see :meth:`from_stored`)."""
        return {**self.to_dict(), "projection": self.projection}

    @classmethod
    def from_dict(cls, d: dict) -> TaggedFormat:
        """Read :meth:`to_dict` or :meth:`to_stored` (no ``projection`` key: ``None``; no
        ``pool_factor`` key: 1, a store or an encoder that pools nothing; a pool factor without
        ``pool_method``: ``"ward"``, what pooled before methods were recorded)."""
        pool = d.get("pool_factor", 1)
        if not isinstance(pool, int) or isinstance(pool, bool):
            raise ValueError(f"pool_factor must be a whole number, got {pool!r}")
        return cls(beta=float(d["beta"]), lambda_=float(d["lambda_"]), projection=d.get("projection"),
                   pool_factor=pool, pool_method=d.get("pool_method", "ward"),
                   pool_frequent_ids=tuple(d.get("pool_frequent_ids") or ()))

    @classmethod
    def from_stored(cls, d: dict) -> TaggedFormat:
        """Read what a store recorded; a record without a ``projection`` key was written
        before stores recorded it: :data:`UNRECORDED`.

        >>> TaggedFormat.from_stored({"beta": 0.9, "lambda_": 0.75}).projection
        'unrecorded'
        """
        return cls.from_dict({**d, "projection": d.get("projection", UNRECORDED)})

    def conflict(self, requested: TaggedFormat | None) -> str | None:
        """Why lists stored with this (saved) format cannot be used with ``requested``, or
        ``None`` when they can. The pool factor does not count here (queries are never pooled;
        :func:`~uibk_embedding.token_pooling.check_pool_factor` guards the writes). Constants
        must be equal; projections too when both sides declare one, and the models
        (``<projection>@<model hash>``) when both name theirs (a record written before models
        were named accepts any, as before). A store written before
        projections were recorded (:data:`UNRECORDED`) was filled by a seeded random projection,
        the only kind there was: it accepts a ``random-*`` projection (as before) and refuses any
        other.

        >>> saved = TaggedFormat(projection="random-1a2b@m1")
        >>> saved.conflict(TaggedFormat(projection="random-1a2b@m1")) is None
        True
        >>> print(saved.conflict(TaggedFormat(projection="pca-3c4d@m1")))  # doctest: +ELLIPSIS
        its lists were encoded with projection random-1a2b@m1, not pca-3c4d@m1: ...
        >>> print(saved.conflict(TaggedFormat(projection="random-1a2b@m2")))  # doctest: +ELLIPSIS
        its lists were encoded by another model (model m1, not m2) ...
        >>> TaggedFormat(projection="random-1a2b").conflict(saved) is None  # recorded before models
        True
        """
        if requested is None:
            return None
        if (self.beta, self.lambda_) != (requested.beta, requested.lambda_):
            return (f"it holds lists of beta={self.beta}, lambda={self.lambda_}, not "
                    f"beta={requested.beta}, lambda={requested.lambda_}")
        if self.projection is None or requested.projection is None or self.projection == requested.projection:
            return None
        (mine, _, my_model), (theirs, _, their_model) = (
            f.projection.partition("@") for f in (self, requested))  # type: ignore[union-attr]
        if mine == theirs:
            if my_model and their_model and my_model != their_model:
                return (f"its lists were encoded by another model (model {my_model}, not {their_model}) "
                        f"with the same projection {mine}: this encoder's queries would not match the "
                        "stored vectors. Search it with the encoder that indexed it, or index into a "
                        "new store")
            return None
        if mine == UNRECORDED:
            if theirs.startswith("random-"):
                return None
            return (f"it was written before stores recorded the encoder's projection, when every "
                    f"encoder used its seeded random one, and this encoder uses {requested.projection}: its "
                    "queries would not match the stored token vectors. Open it with an encoder "
                    "made with projection='random' (CLI: --projection random), or index into a "
                    "new store")
        hint = ""
        if mine.startswith("pca-") and theirs.startswith("random-"):
            hint = (" (a store indexed by the embedded default of uibk-embedding 0.2.0, which used the "
                    "shipped PCA projection: open it with load_encoder(projection='pca'), CLI "
                    "--projection pca)")
        return (f"its lists were encoded with projection {self.projection}, not {requested.projection}: "
                "this encoder's queries would not match the stored token vectors. Search it with the encoder "
                f"that indexed it{hint}, or index into a new store")

    # -- construction ----------------------------------------------------------------------
    def write_slots(self, out: Rows, z: Any, norms: Any) -> Rows:
        """Slot rows ``[-sqrt(1 - delta); sqrt(delta) z / |z|]`` written into ``out`` (numpy or
        torch, ``(..., 128)``; :func:`tag_rows`), before any dense weight."""
        return tag_rows(out, z, norms, self.slot_tag, self.delta)

    def write_tokens(self, out: Rows, u: Any, norms: Any) -> Rows:
        """Token rows ``[+sqrt(1 - beta); sqrt(beta) u / |u|]`` written into ``out`` (numpy or
        torch, ``(..., 128)``; :func:`tag_rows`)."""
        return tag_rows(out, u, norms, self.token_tag, self.beta)

    def token_vectors(self, u: np.ndarray) -> np.ndarray:
        """Tagged token vectors from 127-d token directions (normalised here).

        >>> TaggedFormat().token_vectors(np.ones((2, 127))).shape
        (2, 128)
        """
        u = np.asarray(u)
        if u.ndim != 2 or u.shape[1] != BODY:
            raise ValueError(f"token directions must have shape (n, {BODY}), got {u.shape}")
        u = np.asarray(u, dtype=np.float64)
        return self.write_tokens(np.empty((u.shape[0], DIM)), u, _row_norms(u, "token direction"))

    def slot_vectors(self, g_slices: np.ndarray) -> np.ndarray:
        """Tagged slot vectors from the three 127-d slices of ``R g`` (normalised here)."""
        g_slices = np.asarray(g_slices)
        if g_slices.shape != (self.n_slots, BODY):
            raise ValueError(
                f"slot slices must have shape ({self.n_slots}, {BODY}), got {g_slices.shape}"
            )
        g = np.asarray(g_slices, dtype=np.float64)
        return self.write_slots(np.empty((self.n_slots, DIM)), g, _row_norms(g, "dense slice"))

    def build(
        self, g_slices: np.ndarray, u: np.ndarray, dense_weight: float = 1.0
    ) -> np.ndarray:
        """One tagged list: slots (scaled by ``dense_weight``, queries only) then tokens.

        Returns float32 of shape ``(3 + n_tokens, 128)``.
        """
        w = check_dense_weight(dense_weight)
        slots = apply_dense_weight(self.slot_vectors(g_slices), w)
        toks = self.token_vectors(u) if len(u) else np.zeros((0, DIM))
        return np.concatenate([slots, toks]).astype(np.float32)

    def split(self, dense: np.ndarray, R: np.ndarray) -> np.ndarray:
        """Project sentence vector(s) ``dense`` (D,) with ``R`` (381 x D) into 3 slices."""
        z = np.asarray(R, dtype=np.float64) @ np.asarray(dense, dtype=np.float64)
        return z.reshape(self.n_slots, BODY)


def infer_format(document: np.ndarray) -> TaggedFormat:
    """Read ``beta`` and ``lambda_`` back from the tags of a stored (unit-slot) document."""
    d = np.asarray(document, dtype=np.float64)
    tok = d[d[:, 0] > 0, 0]
    slot = d[d[:, 0] < 0, 0]
    if len(slot) == 0:
        raise ValueError("document has no slot rows (negative tag): not a tagged list")
    delta = 1 - float(np.median(slot)) ** 2
    beta = 1 - float(np.median(tok)) ** 2 if len(tok) else 0.9
    return TaggedFormat(beta=beta, lambda_=N_SLOTS * delta / beta)


@dataclass(frozen=True)
class Decomposition:
    """One MaxSim score split into its parts, from the pairs MaxSim actually selected.

    ``total == constant + beta * (token + lambda_ * dense_weight * dense)`` always holds (it
    is computed that way, up to float error); the closed form of docs/format.md#identity is what it means
    only when ``separated`` (every query token selected a document token and every query slot
    a document slot) and ``slots_aligned`` (query slot ``s`` selected document slot ``s``).

    Attributes
    ----------
    total: the MaxSim score.
    constant: sum of the tag products of the selected pairs (``C(q)`` when separated).
    token: token MaxSim, sum over query tokens of the best ``u . u'``.
    dense: mean over the 3 slots of ``g_s . g'_s`` (a cosine in [-1, 1]).
    dense_weight: the query-time dense weight ``w`` (norm of the query slots).
    """

    total: float
    constant: float
    token: float
    dense: float
    dense_weight: float
    beta: float
    lambda_: float
    separated: bool
    slots_aligned: bool
    n_query_tokens: int
    selected: tuple[int, ...]

    @property
    def token_part(self) -> float:
        """Contribution of token matching to the total: ``beta * token``."""
        return self.beta * self.token

    @property
    def dense_part(self) -> float:
        """Contribution of the dense head: ``beta * lambda_ * w * dense``."""
        return self.beta * self.lambda_ * self.dense_weight * self.dense

    def as_dict(self) -> dict[str, float | bool | int]:
        d = asdict(self)
        d.pop("selected")
        d["token_part"] = self.token_part
        d["dense_part"] = self.dense_part
        return d


def _slot_mask(x: np.ndarray) -> np.ndarray:
    return x[:, 0] < 0


def decompose(
    query: np.ndarray, document: np.ndarray, fmt: TaggedFormat | None = None
) -> Decomposition:
    """Split ``MaxSim(query, document)`` into constant, token part and dense part.

    The best document vector of every query vector is found exactly (float64), then each
    product is split into its tag part (coordinate 0) and body part. ``fmt`` defaults to the
    format read from the document's tags (:func:`infer_format`).
    """
    q = np.asarray(query, dtype=np.float64)
    d = np.asarray(document, dtype=np.float64)
    if q.ndim != 2 or d.ndim != 2 or q.shape[1] != DIM or d.shape[1] != DIM:
        raise ValueError(f"expected (n, {DIM}) arrays, got {q.shape} and {d.shape}")
    if len(q) == 0 or len(d) == 0:
        raise ValueError("decompose needs at least one query and one document vector")
    fmt = fmt or infer_format(d)
    sims = q @ d.T
    best = sims.argmax(axis=1)
    q_slot = _slot_mask(q)
    d_slot = _slot_mask(d)
    tag = q[:, 0] * d[best, 0]
    body = np.einsum("ij,ij->i", q[:, 1:], d[best, 1:])
    total = float(sims[np.arange(len(q)), best].sum())
    slot_norms = np.linalg.norm(q[q_slot], axis=1)
    w = float(slot_norms.mean()) if len(slot_norms) else 1.0
    token = float(body[~q_slot].sum() / fmt.beta)
    n_slots = int(q_slot.sum())
    dense = float(body[q_slot].sum() / (fmt.delta * w * fmt.n_slots)) if n_slots else 0.0
    separated = bool(np.all(d_slot[best] == q_slot))
    d_slot_rank = np.cumsum(d_slot) - 1  # slot index of each document slot row
    q_slot_rank = np.cumsum(q_slot) - 1
    aligned = bool(separated and np.all(d_slot_rank[best[q_slot]] == q_slot_rank[q_slot]))
    return Decomposition(
        total=total,
        constant=float(tag.sum()),
        token=token,
        dense=dense,
        dense_weight=w,
        beta=fmt.beta,
        lambda_=fmt.lambda_,
        separated=separated,
        slots_aligned=aligned,
        n_query_tokens=int((~q_slot).sum()),
        selected=tuple(int(b) for b in best),
    )


@dataclass(frozen=True)
class SeparationReport:
    """Result of :func:`check_separation` over many query/document pairs."""

    pairs: int
    token_selected_slot: int  # query tokens whose best match was a document slot
    slot_selected_token: int  # query slots whose best match was a document token
    slot_misaligned: int  # query slots that selected another document slot
    query_tokens: int
    query_slots: int

    @property
    def held(self) -> bool:
        return self.token_selected_slot == 0 and self.slot_selected_token == 0

    def as_dict(self) -> dict[str, int | bool]:
        d = asdict(self)
        d["held"] = self.held
        return d


def check_separation(
    queries: Sequence[np.ndarray], documents: Sequence[np.ndarray]
) -> SeparationReport:
    """Count separation failures over every (query, document) pair.

    >>> import numpy as np
    >>> fmt = TaggedFormat(); rng = np.random.default_rng(1)
    >>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
    >>> check_separation([mk(4)], [mk(6), mk(7)]).slot_selected_token
    0
    """
    tok_slot = slot_tok = mis = nq_tok = nq_slot = pairs = 0
    for q in queries:
        q = np.asarray(q, dtype=np.float64)
        qs = _slot_mask(q)
        q_rank = np.cumsum(qs) - 1
        for d in documents:
            d = np.asarray(d, dtype=np.float64)
            ds = _slot_mask(d)
            d_rank = np.cumsum(ds) - 1
            best = (q @ d.T).argmax(axis=1)
            tok_slot += int(np.sum(~qs & ds[best]))
            slot_tok += int(np.sum(qs & ~ds[best]))
            mis += int(np.sum(qs & ds[best] & (d_rank[best] != q_rank)))
            nq_tok += int((~qs).sum())
            nq_slot += int(qs.sum())
            pairs += 1
    return SeparationReport(pairs, tok_slot, slot_tok, mis, nq_tok, nq_slot)


def orthonormal_rows(n_rows: int, n_cols: int, seed: int) -> np.ndarray:
    """A fixed ``(n_rows, n_cols)`` matrix with orthonormal rows (or columns when
    ``n_rows > n_cols``), drawn from ``seed``; unique given the seed (QR with a sign fix).

    >>> m = orthonormal_rows(127, 384, seed=0)
    >>> bool(np.allclose(m @ m.T, np.eye(127)))
    True
    """
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((max(n_rows, n_cols), min(n_rows, n_cols)))
    qm, r = np.linalg.qr(a)
    qm = qm * np.sign(np.diag(r))
    return (qm.T if n_rows <= n_cols else qm).astype(np.float64)


def dense_vector(tagged: np.ndarray, n_slots: int = N_SLOTS) -> np.ndarray:
    """The 381-d unit vector whose dot products are the dense part: the three slot bodies,
    concatenated and normalised, so ``dense_vector(q) . dense_vector(d)`` equals
    ``(1/3) sum_s g_s . g'_s`` (for use as a single-vector prefetch index).

    >>> fmt = TaggedFormat(); rng = np.random.default_rng(2)
    >>> x = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(2, 127)))
    >>> dense_vector(x).shape
    (381,)
    """
    t = np.asarray(tagged, dtype=np.float32)
    body = t[:n_slots, 1:].reshape(-1)
    n = np.linalg.norm(body)
    if n == 0:
        raise ValueError("tagged list has zero slot bodies")
    return body / n


RETRIEVAL_MODES = ("hybrid", "dense", "tokens")


def check_retrieval_mode(mode: Any) -> str:
    """``mode`` as one of :data:`RETRIEVAL_MODES` (an enum member counts by its ``value``, so
    langchain-qdrant's ``RetrievalMode.HYBRID`` / ``.DENSE`` are accepted); a ``ValueError``
    naming the modes otherwise (``"sparse"``: this format's lexical part is ``"tokens"``).

    >>> check_retrieval_mode("dense")
    'dense'
    >>> check_retrieval_mode("sparse")
    Traceback (most recent call last):
    ...
    ValueError: retrieval_mode must be one of 'hybrid', 'dense', 'tokens', got 'sparse'
    """
    value = getattr(mode, "value", mode)
    if not isinstance(value, str) or value not in RETRIEVAL_MODES:
        raise ValueError(
            f"retrieval_mode must be one of {', '.join(map(repr, RETRIEVAL_MODES))}, got {value!r}"
        )
    return value


def query_for_mode(query: np.ndarray, mode: Any = "hybrid") -> np.ndarray:
    """The query list for a retrieval mode, per query, with no re-index: ``"hybrid"`` the list
    itself, ``"dense"`` its slot rows only (MaxSim is then the dense head's score), ``"tokens"``
    its token rows only (token MaxSim). Every backend takes all three (a query may be slots only
    or tokens only). A ``ValueError`` when the query has no rows of the kind asked.

    >>> fmt = TaggedFormat(); rng = np.random.default_rng(0)
    >>> q = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(5, 127)))
    >>> [query_for_mode(q, m).shape[0] for m in RETRIEVAL_MODES]
    [8, 3, 5]
    """
    mode = check_retrieval_mode(mode)
    q = np.asarray(query)
    if mode == "hybrid":
        return q
    slots = q[:, 0] < 0
    out = q[slots] if mode == "dense" else q[~slots]
    if len(out) == 0:
        kind = "slot" if mode == "dense" else "token"
        raise ValueError(f"retrieval_mode {mode!r}: the query has no {kind} rows")
    return out
