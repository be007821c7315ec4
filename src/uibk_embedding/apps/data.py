"""Readers for the collections the CLI indexes and evaluates: BEIR folders and JSONL files.

A BEIR folder holds ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id``, ``corpus-id``, ``score`` with a
header line). A plain JSONL file holds one document per line with ``_id`` (or ``id``) and
``text`` (and optional ``title`` and ``metadata``).

Every other field of a line is kept as metadata (:func:`row_fields`): ``{"id": "1", "text":
"...", "topic": "finance"}`` is stored with ``{"topic": "finance"}``, as a nested
``"metadata": {"topic": "finance"}`` is; nothing is dropped. ``title`` is the document's title: it
is encoded with the text (:attr:`Document.full_text`) and stored under ``title``, as BEIR's titles
always were.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uibk_embedding.adapters.base import validate_ids, validate_metadata
from uibk_embedding.adapters.indexing import stored_metadata
from uibk_embedding.errors import DataError, InvalidInput
from uibk_embedding.tagged import check_text


@dataclass
class Document:
    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def stored_metadata(self, store_text: bool = True) -> dict[str, Any]:
        """The metadata this document is stored with: its own, plus ``title`` and ``text``
        unless ``store_text`` is False (:func:`~uibk_embedding.adapters.indexing.stored_metadata`).

        >>> Document("d1", "body", "T", {"year": 1962}).stored_metadata()
        {'year': 1962, 'title': 'T', 'text': 'body'}
        """
        if not store_text:
            return dict(self.metadata)
        return stored_metadata(self.metadata, title=self.title, text=self.text)

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
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a BOM (Windows editors) is dropped
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


def check_id(value: Any, kind: str = "document") -> tuple[str, str]:
    """``(id, "")`` for a usable corpus or query id, else ``("", reason)``: the id rules of
    :func:`check_document`, shared by :func:`read_queries`. A JSON integer is read as its digits;
    a number with a fraction, a boolean, anything else but a string, and an empty or blank
    string are refused.

    >>> check_id(7), check_id(" ", "query")
    (('7', ''), ('', 'id must be a non-empty string, got an empty query id'))
    """
    if isinstance(value, float):  # 1.10 reads as 1.1: the id would no longer match its qrels
        return "", (f"id {value!r} is a JSON number with a fraction, which does not keep its "
                    "spelling (1.10 reads as 1.1): write ids as strings")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # BEIR files write numeric ids too
    if value is None:
        return "", "id must be a non-empty string: missing field '_id' or 'id'"
    if not isinstance(value, str):
        return "", f"id must be a non-empty string, got {type(value).__name__} {value!r}"
    if not value.strip():
        return "", f"id must be a non-empty string, got an empty {kind} id"
    return value, ""


@dataclass
class BadDocument:
    """A corpus row that is not a document: its id, its position in the input and why.

    ``no_text``: the row is well formed but has no text (title and text empty), which
    :func:`read_corpus` skips with a warning and the distributed run reports like any bad row.

    >>> print(BadDocument("d7", "corpus.jsonl:7", "text is empty or whitespace only"))
    id 'd7' at position corpus.jsonl:7: text is empty or whitespace only
    """

    id: Any
    position: Any
    reason: str
    no_text: bool = False

    def __str__(self) -> str:
        return f"id {self.id!r} at position {self.position}: {self.reason}"


def check_document(doc_id: Any, text: Any, title: Any = None, metadata: Any = None,
                   position: Any = None) -> Document | BadDocument:
    """One corpus row's fields checked by the rules every reader uses (a JSONL line here, a
    list item or a Ray batch row in :mod:`uibk_embedding.apps.distributed`): the
    :class:`Document`, or a :class:`BadDocument` that says what is wrong (the first problem,
    in the order id, text, title, metadata).

    The rules: the id is a non-empty string (a JSON integer is read as its digits; a JSON
    number with a fraction is refused, it does not keep its spelling); text and title are
    strings or absent, not both empty; metadata is a JSON object; and id and metadata pass
    what every store checks on upsert (length, reserved prefixes, JSON-serialisable values),
    so a bad row is found before anything is written.

    >>> check_document("d1", "a wing", "T", {"year": 1962})
    Document(id='d1', text='a wing', title='T', metadata={'year': 1962})
    >>> print(check_document(None, "a wing", position="c.jsonl:3"))
    id None at position c.jsonl:3: id must be a non-empty string: missing field '_id' or 'id'
    >>> check_document("d2", 42).reason
    'text must be a string, got int'
    >>> check_document("d3", "  ").no_text
    True
    """
    def bad(reason: str, no_text: bool = False) -> BadDocument:
        return BadDocument(doc_id, position, reason, no_text)

    checked, problem = check_id(doc_id)
    if problem:
        return bad(problem)
    doc_id = checked
    if text is not None and not isinstance(text, str):
        return bad(f"text must be a string, got {type(text).__name__}")
    if title is not None and not isinstance(title, str):
        return bad(f"title must be a string, got {type(title).__name__}")
    try:  # a lone surrogate ("\ud800" in the JSON): the tokenizer would fail mid-index
        for name, value in (("text", text), ("title", title)):
            if value is not None:
                check_text(value, f"the {name}")
    except InvalidInput as e:
        return bad(str(e))
    doc = Document(doc_id, text or "", title or "")
    if not doc.full_text.strip():
        return bad("no text" if text is None else "text is empty or whitespace only", no_text=True)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        return bad("metadata must be a JSON object")
    try:  # what every store refuses, refused here: before anything is written
        validate_ids([doc_id])
        doc.metadata = validate_metadata([metadata], 1)[0]
    except (TypeError, ValueError) as e:
        return bad(str(e).replace("ids[0] ", "the id ").replace("metadata[0]", "metadata"))
    return doc


# the fields of a corpus line that are the document itself; every other one is metadata
DOCUMENT_FIELDS = ("_id", "id", "text", "title", "metadata")


def row_fields(obj: dict[str, Any]) -> tuple[Any, Any, Any, Any, str]:
    """``(id, text, title, metadata, problem)`` of one corpus line (a JSON object).

    The id is ``_id``, else ``id``; every field but ``_id``, ``id``, ``text``, ``title`` and
    ``metadata`` is kept as metadata (as LangChain's and LlamaIndex's JSON loaders keep a row's
    other fields), merged with a nested ``metadata`` object. An ``id`` beside a different ``_id``
    is kept as the metadata key ``id``. Nothing is dropped: a key that is both a top-level field
    and a key of ``metadata`` with another value, and a ``metadata`` key ``text`` or ``title``
    (the stored text and title replace them), are a ``problem`` (the row is refused), never
    resolved silently. ``metadata`` that is not an object is left to :func:`check_document`.

    >>> row_fields({"id": "1", "text": "a wing", "topic": "finance", "metadata": {"year": 1962}})
    ('1', 'a wing', None, {'year': 1962, 'topic': 'finance'}, '')
    >>> row_fields({"_id": "1", "text": "x", "topic": "a", "metadata": {"topic": "b"}})[4]
    "field 'topic' is both a top-level field ('a') and a metadata key ('b'): keep one"
    """
    doc_id = obj.get("_id", obj.get("id"))
    metadata = obj.get("metadata")
    extra = {k: v for k, v in obj.items() if k not in DOCUMENT_FIELDS}
    if "_id" in obj and "id" in obj and obj["id"] != obj["_id"]:
        extra["id"] = obj["id"]
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):  # refused by check_document
        return doc_id, obj.get("text"), obj.get("title"), metadata, ""
    for key in ("text", "title"):
        if key in metadata:
            return doc_id, obj.get("text"), obj.get("title"), metadata, (
                f"metadata key {key!r} would be replaced by the document's {key} (stored under "
                f"{key!r}): rename it")
    merged = dict(metadata)
    for k, v in extra.items():
        if k in merged and merged[k] != v:
            return doc_id, obj.get("text"), obj.get("title"), metadata, (
                f"field {k!r} is both a top-level field ({v!r}) and a metadata key ({merged[k]!r}): "
                "keep one")
        merged[k] = v
    return doc_id, obj.get("text"), obj.get("title"), merged, ""


def corpus_file(path: str | os.PathLike) -> Path:
    """The JSONL file of a corpus: ``corpus.jsonl`` in a BEIR folder, else ``path`` itself.

    >>> corpus_file("/data/npl").as_posix(), corpus_file("/data/docs.jsonl").as_posix()
    ('/data/npl', '/data/docs.jsonl')
    """
    p = Path(path)
    return p / "corpus.jsonl" if p.is_dir() else p


def scan_corpus(path: str | os.PathLike) -> Iterator[tuple[int, Document | BadDocument]]:
    """``(line number, Document or BadDocument)`` for every row of a BEIR folder
    (``corpus.jsonl``) or a JSONL file, in file order, each row read by :func:`row_fields` (its
    other fields kept as metadata) and checked by :func:`check_document` (position ``FILE:LINE``).

    What makes the file unusable raises :class:`DataError` at once: it cannot be read, a
    line is not UTF-8 or not a JSON object, an id appears twice, there are no rows.

    >>> import json, tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "docs.jsonl"
    >>> _ = p.write_text(json.dumps({"_id": "a", "text": "wing"}) + chr(10) + json.dumps({"_id": "b"}))
    >>> [(n, type(x).__name__) for n, x in scan_corpus(p)]
    [(1, 'Document'), (2, 'BadDocument')]
    >>> print(list(scan_corpus(p))[1][1])
    id 'b' at position docs.jsonl:2: no text
    """
    p = corpus_file(path)
    seen: set[str] = set()
    rows = 0
    for n, obj in _iter_jsonl(p):
        rows += 1
        doc_id, text, title, metadata, problem = row_fields(obj)
        item = check_document(doc_id, text, title, metadata, f"{p.name}:{n}")
        if problem and isinstance(item, Document):
            item = BadDocument(item.id, f"{p.name}:{n}", problem)
        doc_id = item.id
        if isinstance(doc_id, str):
            if doc_id in seen:
                raise DataError(f"{p}:{n}: duplicate document id {doc_id!r}")
            seen.add(doc_id)
        yield n, item
    if not rows:
        raise DataError(f"{p}: no documents")


def read_corpus(path: str | os.PathLike) -> list[Document]:
    """Documents from a BEIR folder (``corpus.jsonl``) or a JSONL file (:func:`scan_corpus`).

    A bad row (:func:`check_document`) is refused with its file and line; rows whose title
    and text are both empty are kept out with a warning.
    """
    p = corpus_file(path)
    docs: list[Document] = []
    empty = 0
    for n, item in scan_corpus(p):
        if isinstance(item, Document):
            docs.append(item)
        elif item.no_text:
            empty += 1
        else:
            raise DataError(f"{p}:{n}: {item.reason}")
    if empty:
        warnings.warn(f"{p}: skipped {empty} documents with no text", stacklevel=2)
    if not docs:
        raise DataError(f"{p}: no documents")
    return docs


def kept_metadata(docs: Sequence[Document]) -> str:
    """One line that says which metadata keys ``docs`` carry (each with how many documents have
    it), so a user sees what ``--filter`` can match; ``""`` when none.

    A key holding a list in some document is named apart: a filter never matches a list value
    (docs/filters.md), so ``--filter '{"tags": "solar"}'`` would find nothing.

    >>> kept_metadata([Document("a", "x", metadata={"topic": "f"}), Document("b", "y")])
    'kept as metadata (for --filter): topic (1 of 2 documents)'
    >>> kept_metadata([Document("a", "x", metadata={"topic": "f", "tags": ["solar"]})])
    'kept as metadata (for --filter): topic; kept, but no filter matches a list: tags'
    """
    counts: dict[str, int] = {}
    lists: dict[str, None] = {}
    for d in docs:
        for k, v in d.metadata.items():
            counts[k] = counts.get(k, 0) + 1
            if isinstance(v, list | tuple):
                lists[k] = None
    if not counts:
        return ""
    plain = [(k, n) for k, n in counts.items() if k not in lists]
    shown = [f"{k} ({n} of {len(docs)} documents)" if n < len(docs) else k for k, n in plain[:12]]
    more = f" and {len(plain) - 12} more keys" if len(plain) > 12 else ""
    names = list(lists)
    listed = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    if not plain:
        return "kept as metadata, but no filter matches a list: " + listed
    line = "kept as metadata (for --filter): " + ", ".join(shown) + more
    return line + ("; kept, but no filter matches a list: " + listed if lists else "")


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    """Queries of a BEIR folder (``queries.jsonl``) or a JSONL file: ``{id: text}``, in file order.

    The corpus rules for ids and texts (:func:`check_id`; a text is a string, not empty, valid
    Unicode); a bad line or a repeated id is refused with its file and line.

    >>> import json, tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "queries.jsonl"
    >>> _ = p.write_text(json.dumps({"_id": 1, "text": "wing flutter"}) + chr(10))
    >>> read_queries(p)
    {'1': 'wing flutter'}
    >>> _ = p.write_text(json.dumps({"_id": "q2", "text": 42}) + chr(10))
    >>> read_queries(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.DataError: .../queries.jsonl:1: query 'q2': text must be a string, got int
    """
    p = Path(path)
    if p.is_dir():
        p = p / "queries.jsonl"
    out: dict[str, str] = {}
    for n, obj in _iter_jsonl(p):
        where = f"{p}:{n}"
        qid, problem = check_id(obj.get("_id", obj.get("id")), "query")
        if problem:
            raise DataError(f"{where}: {problem}")
        if qid in out:
            raise DataError(f"{where}: duplicate query id {qid!r}")
        text = obj.get("text")
        if text is None:
            raise DataError(f"{where}: query {qid!r} has no text")
        if not isinstance(text, str):
            raise DataError(f"{where}: query {qid!r}: text must be a string, got {type(text).__name__}")
        if not text.strip():
            raise DataError(f"{where}: query {qid!r} has an empty text")
        try:
            out[qid] = check_text(text, f"query {qid!r}")
        except InvalidInput as e:
            raise DataError(f"{where}: {e}") from None
    return out


def read_qrels(path: str | os.PathLike, split: str = "test") -> dict[str, dict[str, int]]:
    p = Path(path)
    if p.is_dir():
        p = p / "qrels" / f"{split}.tsv"
    qrels: dict[str, dict[str, int]] = {}
    try:
        lines = p.read_bytes().decode("utf-8-sig").splitlines()  # a BOM is dropped
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
        for name, field_ in (("query", parts[0]), ("corpus", parts[1])):
            if not field_.strip():
                raise DataError(f"{p}:{n}: empty {name} id")
        score = int(value)
        qrels.setdefault(parts[0], {})[parts[1]] = score
    return qrels


def load_beir(path: str | os.PathLike, split: str = "test") -> Collection:
    """A whole BEIR folder. Queries without a relevant document (score > 0) in
    ``qrels/<split>.tsv`` are dropped (as BEIR evaluation does); queries the qrels judge that
    ``queries.jsonl`` lacks cannot be scored: a ``UserWarning`` gives their number and the first
    ids (the metrics average over the others), and none at all is a :class:`DataError`.

    >>> import json, tempfile, pathlib, warnings
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "qrels").mkdir()
    >>> _ = (d / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "wing"}) + chr(10))
    >>> _ = (d / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "wings?"}) + chr(10))
    >>> qrels = [("q1", "d1", "1"), ("q2", "d1", "1")]
    >>> _ = (d / "qrels" / "test.tsv").write_text(chr(10).join(chr(9).join(r) for r in qrels))
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     c = load_beir(d)
    >>> c.queries, str(w[0].message).split(";")[0]
    ({'q1': 'wings?'}, '1 queries with a relevant document in qrels/test.tsv are not in queries.jsonl (q2)')
    """
    p = Path(path)
    if not p.is_dir():
        raise DataError(f"{p} is not a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    corpus = read_corpus(p)
    queries = read_queries(p)
    qrels = read_qrels(p, split)
    judged = {q: t for q, t in queries.items() if any(v > 0 for v in qrels.get(q, {}).values())}
    if not judged:  # refused before the corpus is encoded, not after
        raise DataError(f"{p}: no query of queries.jsonl has a relevant document (score > 0) in "
                        f"qrels/{split}.tsv ({len(queries)} queries, {len(qrels)} judged): nothing to "
                        "evaluate")
    lost = [q for q, rel in qrels.items() if q not in queries and any(v > 0 for v in rel.values())]
    if lost:  # BEIR's own loader refuses the folder; the scores would average over fewer queries
        shown = ", ".join(lost[:5]) + (", ..." if len(lost) > 5 else "")
        warnings.warn(f"{len(lost)} queries with a relevant document in qrels/{split}.tsv are not in "
                      f"queries.jsonl ({shown}); the scores are averaged over the other {len(judged)}",
                      stacklevel=2)
    return Collection(p.name, corpus, judged, {q: qrels[q] for q in judged})
