"""Readers for the collections the CLI indexes and evaluates: BEIR folders and JSONL files.

A BEIR folder holds ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id``, ``corpus-id``, ``score`` with a
header line). A plain JSONL file holds one document per line with ``_id`` (or ``id``) and
``text`` (and optional ``title`` and ``metadata``).

Example
-------
>>> import json, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "docs.jsonl").write_text(json.dumps({"id": "1", "text": "hello"}) + "\\n")
>>> [doc.id for doc in read_corpus(d / "docs.jsonl")]
['1']
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uibk_embedding.adapters.base import validate_ids, validate_metadata
from uibk_embedding.errors import DataError


@dataclass
class Document:
    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def full_text(self) -> str:
        """Title and text as the encoder reads them (title first when it adds anything)."""
        if self.title and not self.text.startswith(self.title):
            return f"{self.title}. {self.text}" if self.text else self.title
        return self.text or self.title


@dataclass
class Collection:
    name: str
    corpus: list[Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    with f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            yield n, obj


def _str_field(obj: dict, names: tuple[str, ...], where: str, required: bool = True) -> str:
    for name in names:
        if name in obj and obj[name] is not None:
            v = obj[name]
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise DataError(f"{where}: field {name!r} must be a string, got {type(v).__name__}")
            if isinstance(v, float) and names[0] in ("_id", "id"):
                # 1.10 reads as 1.1: the id would no longer match the qrels that name it
                raise DataError(f"{where}: id {v!r} is a JSON number with a fraction, which does not keep "
                                "its spelling (1.10 reads as 1.1): write ids as strings")
            return str(v)
    if required:
        raise DataError(f"{where}: missing field {' or '.join(repr(n) for n in names)}")
    return ""


def read_corpus(path: str | os.PathLike) -> list[Document]:
    """Documents from a BEIR folder (``corpus.jsonl``) or a JSONL file. Duplicate ids are
    refused; documents whose title and text are both empty are kept out with a warning."""
    p = Path(path)
    if p.is_dir():
        p = p / "corpus.jsonl"
    docs: list[Document] = []
    seen: set[str] = set()
    empty = 0
    for n, obj in _iter_jsonl(p):
        where = f"{p}:{n}"
        doc_id = _str_field(obj, ("_id", "id"), where)
        if not doc_id.strip():
            raise DataError(f"{where}: empty document id")
        if doc_id in seen:
            raise DataError(f"{where}: duplicate document id {doc_id!r}")
        seen.add(doc_id)
        md = obj.get("metadata") or {}
        if not isinstance(md, dict):
            raise DataError(f"{where}: 'metadata' must be an object")
        try:  # what every store refuses, refused here: before anything is written
            validate_ids([doc_id])
            validate_metadata([md], 1)
        except (TypeError, ValueError) as e:
            why = str(e).replace("ids[0] ", "the id ").replace("metadata[0]", "metadata")
            raise DataError(f"{where}: {why}") from None
        doc = Document(doc_id, _str_field(obj, ("text",), where, required=False),
                       _str_field(obj, ("title",), where, required=False), md)
        if not doc.full_text.strip():
            empty += 1
            continue
        docs.append(doc)
    if empty:
        warnings.warn(f"{p}: skipped {empty} documents with no text", stacklevel=2)
    if not docs:
        raise DataError(f"{p}: no documents")
    return docs


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    p = Path(path)
    if p.is_dir():
        p = p / "queries.jsonl"
    out: dict[str, str] = {}
    for n, obj in _iter_jsonl(p):
        where = f"{p}:{n}"
        qid = _str_field(obj, ("_id", "id"), where)
        if qid in out:
            raise DataError(f"{where}: duplicate query id {qid!r}")
        out[qid] = _str_field(obj, ("text",), where)
    return out


def read_qrels(path: str | os.PathLike, split: str = "test") -> dict[str, dict[str, int]]:
    p = Path(path)
    if p.is_dir():
        p = p / "qrels" / f"{split}.tsv"
    qrels: dict[str, dict[str, int]] = {}
    try:
        lines = p.read_bytes().decode("utf-8").splitlines()
    except OSError as e:
        raise DataError(f"cannot read {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if n == 1 and parts[0].strip().lower() in ("query-id", "qid", "query_id"):
            continue
        if len(parts) != 3:
            raise DataError(f"{p}:{n}: expected 3 tab-separated fields, got {len(parts)}")
        try:
            value = float(parts[2])
        except ValueError:
            raise DataError(f"{p}:{n}: score {parts[2]!r} is not a number") from None
        if not math.isfinite(value) or value != int(value):
            raise DataError(f"{p}:{n}: score {parts[2]!r} is not a finite whole number")
        score = int(value)
        qrels.setdefault(parts[0], {})[parts[1]] = score
    return qrels


def load_beir(path: str | os.PathLike, split: str = "test") -> Collection:
    """A whole BEIR folder. Queries without judgments are dropped (as BEIR evaluation does)."""
    p = Path(path)
    if not p.is_dir():
        raise DataError(f"{p} is not a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    corpus = read_corpus(p)
    queries = read_queries(p)
    qrels = read_qrels(p, split)
    judged = {q: t for q, t in queries.items() if any(v > 0 for v in qrels.get(q, {}).values())}
    return Collection(p.name, corpus, judged, {q: qrels[q] for q in judged})
