"""Qdrant's own compression behind the profile names (issue 59), for the client store (a server,
a cluster, local mode) and Qdrant Edge alike: what each profile sets on the multivector, how it is
searched, and the check of an existing collection's settings against its recorded profile.

======================  ====================================================================
profile                 what Qdrant keeps and how a search runs
======================  ====================================================================
``exact`` (default)     float32 vectors; exact MaxSim (``SearchParams(exact=True)``)
``float16``             ``datatype=float16``; exact MaxSim over the rounded vectors
``compact``             ``datatype=turbo8`` (TurboQuant 8-bit rows, no float originals kept);
                        exact MaxSim over the decoded rows
``int8``                scalar int8 quantization in RAM (``always_ram``), float16 originals on
                        disk (``on_disk``), read for ``get`` only; the scan scores the int8
                        codes, not rescored (``rescore=False``)
``int8-rerank``         the same codes and originals; the scan's best ``oversampling * k``
                        rescored from the originals (``rescore=True``)
``exact-rerank``        binary quantization, 2 bits a coordinate (query as 8-bit scalars), in
                        RAM; float16 originals on disk; rescored as ``int8-rerank``
======================  ====================================================================

The quantized profiles search with ``exact=False`` (an exact search ignores the quantized
codes; measured on Qdrant Edge 0.9); with no HNSW on the multivector (the default ``m=0``) that
is still a full scan, of the codes. Qdrant builds the codes when it optimizes a segment: a server
does on its own past its indexing threshold, an Edge shard when :meth:`optimize` is called;
until then a segment is scanned from its originals (exactly). qdrant-client's local mode (pure
Python) keeps and checks these settings but stores float32 and always searches exactly.

Example
-------
>>> rerank_pool(10), rerank_pool(100)
(10.0, 4.0)
>>> SETTINGS["exact-rerank"].quantization, SETTINGS["int8"].rescore
('binary-two_bits', False)
>>> config_problems("float16", "tagged", "float16", None)
[]
>>> print(*config_problems("exact", "tagged", "float16", None))
'tagged' stores datatype float16, needs float32 for profile 'exact'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_POOL = 100
"""A rescoring profile rescores at least this many documents (and at least ``4 k``), as the
exact store's rerank profiles do (``MIN_RERANK_DEPTH``)."""


@dataclass(frozen=True)
class QdrantProfile:
    """One profile's Qdrant settings: the originals' ``datatype``, the ``quantization`` kept
    beside them (``"scalar-int8"``, ``"binary-two_bits"`` or None), whether the originals live on
    disk, and whether a search rescores the codes' best from them (None: no codes)."""

    datatype: str
    quantization: str | None = None
    on_disk: bool | None = None
    rescore: bool | None = None


SETTINGS: dict[str, QdrantProfile] = {
    "exact": QdrantProfile("float32"),
    "float16": QdrantProfile("float16"),
    "compact": QdrantProfile("turbo8"),
    "int8": QdrantProfile("float16", "scalar-int8", True, False),
    "int8-rerank": QdrantProfile("float16", "scalar-int8", True, True),
    "exact-rerank": QdrantProfile("float16", "binary-two_bits", True, True),
}
SUPPORTED: dict[str, str] = {
    "exact": "float32 vectors, exact MaxSim",
    "float16": "datatype float16",
    "compact": "datatype turbo8, no float originals",
    "int8": "scalar int8 codes in RAM, float16 originals on disk, not rescored",
    "int8-rerank": "scalar int8 codes in RAM, rescored from float16 originals on disk",
    "exact-rerank": "binary 2-bit codes in RAM, rescored from float16 originals on disk",
}
"""What each profile configures (:func:`~uibk_embedding.adapters.engine_profiles.check_profile`)."""


def rerank_pool(k: int) -> float:
    """Qdrant's ``oversampling`` for ``k`` hits: the codes' best ``max(MIN_POOL, 4 k)`` rescored."""
    return max(4.0, MIN_POOL / k)


def config_problems(profile: str, name: str, datatype: str | None, quantization: str | None) -> list[str]:
    """What differs between the multivector ``name``'s settings in the engine (its ``datatype``,
    None meaning float32, and :func:`quantization_kind`) and what ``profile`` sets."""
    want = SETTINGS[profile]
    out = []
    if (datatype or "float32") != want.datatype:
        out.append(f"{name!r} stores datatype {datatype}, needs {want.datatype} for profile {profile!r}")
    if quantization != want.quantization:
        out.append(f"{name!r} has {quantization or 'no'} quantization, needs {want.quantization or 'none'} "
                   f"for profile {profile!r}")
    return out


def quantization_kind(cfg: Any) -> str | None:
    """``"scalar-int8"``, ``"binary-ENCODING"``, ``"product"``, ``"turbo"`` or None for a
    quantization config: a qdrant-client model, or the dict an Edge shard's ``edge_config.json``
    holds (``{"scalar": {"type": "int8"}}``).

    >>> quantization_kind({"binary": {"always_ram": True, "encoding": "two_bits"}}), quantization_kind(None)
    ('binary-two_bits', None)
    """
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        cfg = cfg.model_dump(mode="json", exclude_none=True)
    for kind, inner in cfg.items():
        inner = inner or {}
        if kind == "scalar":
            return f"scalar-{inner.get('type', 'int8')}"
        if kind == "binary":
            return f"binary-{inner.get('encoding') or 'one_bit'}"
        return kind
    return None


def client_vector_params(profile: str, models: Any) -> dict[str, Any]:
    """``VectorParams`` keywords (qdrant-client ``models``) of ``profile``'s multivector."""
    s = SETTINGS[profile]
    out: dict[str, Any] = {"datatype": models.Datatype(s.datatype)}
    if s.quantization == "scalar-int8":
        out["quantization_config"] = models.ScalarQuantization(scalar=models.ScalarQuantizationConfig(
            type=models.ScalarType.INT8, always_ram=True))
    elif s.quantization == "binary-two_bits":
        out["quantization_config"] = models.BinaryQuantization(binary=models.BinaryQuantizationConfig(
            always_ram=True, encoding=models.BinaryQuantizationEncoding.TWO_BITS,
            query_encoding=models.BinaryQuantizationQueryEncoding.SCALAR8BITS))
    if s.on_disk:
        out["on_disk"] = True
    return out


def edge_vector_params(profile: str, e: Any) -> dict[str, Any]:
    """``EdgeVectorParams`` keywords (the ``qdrant_edge`` module ``e``) of ``profile``'s multivector."""
    s = SETTINGS[profile]
    names = {"float32": "Float32", "float16": "Float16", "turbo8": "Turbo8"}
    out: dict[str, Any] = {"datatype": getattr(e.VectorStorageDatatype, names[s.datatype])}
    if s.quantization == "scalar-int8":
        out["quantization_config"] = e.ScalarQuantizationConfig(e.ScalarType.Int8, always_ram=True)
    elif s.quantization == "binary-two_bits":
        out["quantization_config"] = e.BinaryQuantizationConfig(
            always_ram=True, encoding=e.BinaryQuantizationEncoding.TwoBits,
            query_encoding=e.BinaryQuantizationQueryEncoding.Scalar8Bits)
    if s.on_disk:
        out["on_disk"] = True
    return out


def search_params(profile: str, k: int, search_cls: Any, quant_cls: Any) -> Any:
    """The ``SearchParams`` of a scan of ``profile``'s codes (``search_cls``/``quant_cls``: the
    client's or Edge's ``SearchParams`` and ``QuantizationSearchParams``); None for a profile
    without codes (the caller's exact search)."""
    s = SETTINGS[profile]
    if s.quantization is None:
        return None
    q = quant_cls(rescore=bool(s.rescore), oversampling=rerank_pool(k) if s.rescore else None)
    return search_cls(exact=False, quantization=q)
