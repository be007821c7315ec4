"""``uibk-embed serve``: one shared encoder over HTTP for many processes (FastAPI + uvicorn).

Endpoints
---------
``GET /health``
    JSON: ``service`` ("uibk-embed"), ``model`` (a name, never a server path), ``device``, ``backend``
    (``--encoder-backend``: torch, onnx, openvino, openvino-bf16),
    ``format`` (beta, lambda_, projection), ``dense_weight``, ``dim``, length caps, ``limits`` and
    ``auth`` (whether an API key is required). Open without a key, for load balancers. Should the
    shared encoder's worker thread fail (it encodes nothing more), it answers 503 with ``status``
    ``"failed"`` and ``error``.
``GET /metrics``
    Prometheus text format: requests by status, texts, token vectors, requests in flight and
    queued, request latency and texts-per-forward-pass histograms.
``GET /stats``
    JSON counters of the shared encoder: ``requests``, ``texts``, ``passes`` (forward passes),
    ``merged_passes`` (passes holding texts of several requests), ``multi_client_passes``
    (of several client processes), ``clients`` (distinct client ids among the last 1,024 seen), ``errors``.
``POST /encode``
    JSON request ``{"kind": "documents" | "queries", "texts": [...], "dense_weight": w | null}``
    and nothing else; the answer is ``application/x-uibk-vectors``, the binary float32 payload of
    :func:`~uibk_embedding.encoder.remote.pack_payload`, with headers ``X-UIBK-Truncated`` (the
    texts cut, each counted once: at ``max_text_chars`` characters, at the token limit or both),
    ``X-UIBK-Format`` (:func:`~uibk_embedding.encoder.remote.format_id`) and
    ``X-UIBK-Dense-Weight`` (the default dense weight), on every answer of vectors (binary, JSON,
    ``/v1/embeddings``): a client checks them against the ``/health`` it read, so that a server
    restarted with another model is not taken for the first one. Bad input answers 400 with a
    JSON ``detail``; a request over the limits (``max_texts`` texts, ``max_body_bytes`` bytes)
    answers 413; more than ``max_concurrent`` requests at once answer 429 with ``Retry-After``; a
    body not received within ``body_timeout`` seconds answers 408 (and ``uibk-embed serve``
    closes a connection that has sent no whole request head that long after it opened or after
    its last answer). A failed encoding answers 500 without internal details (they go to the
    server's log). A request whose client disconnects is cancelled before it reaches the model
    when it is still queued.

Memory is bounded, not only bytes: the body is parsed by :func:`parse_request`, which takes only
the three keys above and refuses anything else (another key, a text that is not a string, a
nested value) at the first character that does not fit, before building a Python object of it;
while a request waits for the encoder only its list of texts stays alive. The bodies being
received plus the texts queued for the encoder may hold at most ``max_queued_bytes`` bytes and
``max_queued_texts`` texts in all; a request past either answers 429 with ``Retry-After``.
The answers are bounded too, since a token vector (512 bytes) is far larger than the text it comes
from: each request counts an upper bound of its token vectors (per text, 3 plus its characters,
four times that when not ASCII, plus the markers, prompt and query padding the encoder adds, at
most the document length or the longest query: :func:`vector_bound`) from its
admission until its answer is sent (a client that does not read its answer keeps holding it);
past ``max_queued_vectors`` in all it answers 429 too, unless no other request holds vectors.
The server's memory beyond the model is then about ``max_queued_bytes`` plus twice
``max_body_bytes`` (the one body being parsed: requests are parsed one at a time), plus 1 KiB
per token vector of ``max_queued_vectors`` (the vectors and their packed answer; a JSON answer
is written 64 vectors at a time, so it holds no more).

``POST /encode`` with ``Accept: application/json``
    The same request; the answer is JSON instead: ``{"kind", "dim": 128, "truncated": n,
    "vectors": [[[128 floats] per vector] per text]}`` (about 5.5 times the bytes of the binary
    payload: the binary answer stays the default, and what :class:`RemoteEncoder` reads). It is
    written in slices of 64 vectors in a worker thread (never whole, never on the event loop),
    sent with chunked transfer encoding.
``POST /v1/embeddings``
    OpenAI-compatible, so any OpenAI client can use the server (``base_url=URL + "/v1"``,
    ``api_key=`` the server's key). Request ``{"input": "text" | ["text", ...], "model": name,
    "encoding_format": "float" | "base64", "user": ..., "dimensions": 381}`` (only these keys;
    ``model`` is echoed back, the server has one model; token-id inputs are refused). The answer is
    ``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}], "model",
    "usage": {"prompt_tokens", "total_tokens"}}``: each embedding is the **dense sentence vector**
    of the text encoded as a document, the 381-d unit vector
    :func:`~uibk_embedding.tagged.dense_vector` reads from the three slot rows (the slot bodies
    concatenated and normalised: its dot products are the dense cosine of the hybrid score, not
    the token part). ``usage`` counts token vectors. Same limits, budgets and key as ``/encode``.

Text length, one behaviour in-process and on the server: an over-long text is **truncated, never
refused**. In-process, an encoder reads the first ``doc_max_length`` (documents) or
``query_max_length`` (queries) tokens and warns how many texts it cut. The server does the same,
and first cuts a text to its first ``max_text_chars`` characters (``--max-text-chars``, 100,000
by default: a bound on the tokenizer's work, far beyond the 2,048 tokens a document reads, so
the vectors are those of in-process encoding); ``X-UIBK-Truncated`` (and JSON's ``truncated``)
counts the cut texts, and :class:`RemoteEncoder` warns as in-process does.

With an API key (``--api-key-file FILE`` or ``$UIBK_API_KEY``), every endpoint but ``/health`` needs
``Authorization: Bearer KEY`` (compared in constant time) and answers 401 without it; that
includes ``GET /openapi.json`` (the API's schema, open only on a server without a key). There
are no ``/docs`` or ``/redoc`` pages (404): they load their scripts from a CDN, which a server
off the internet cannot reach; this docstring and ``/openapi.json`` describe the API.

Every request goes to one :class:`~uibk_embedding.encoder.shared.SharedEncoder`, whose worker
batches the texts of concurrent requests (from any number of client processes) together.

Command line::

    uibk-embed serve [--encoder PATH] [--host 127.0.0.1] [--port 8765] [--device cuda]
                     [--max-wait-ms 5] [--batch-tokens N] [--max-texts 1024]
                     [--max-text-chars 100000] [--max-body-mb 32] [--threads N]
                     [--api-key-file FILE] [--max-concurrent-requests 64]
                     [--body-timeout-s 30] [--idle-timeout-s 5]
                     [--max-queued-mb 256] [--max-queued-texts 8192]
                     [--max-queued-vectors 4194304]

Example
-------
>>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
>>> cfg = UIBKConfig.tiny()
>>> shared = SharedEncoder(UIBKEncoder.random(cfg, train_tokenizer(cfg, ["a wing"])))
>>> app = create_app(shared)
>>> sorted(r.path for r in app.routes if r.path in ("/health", "/stats", "/encode", "/metrics"))
['/encode', '/health', '/metrics', '/stats']
>>> shared.close()
"""

import argparse
import asyncio
import base64
import contextlib
import hmac
import json
import logging
import os
import re
import socket
import sys
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from json.decoder import scanstring
from json.scanner import NUMBER_RE
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding.encoder.inputs import cut_text
from uibk_embedding.encoder.onnx_backend import BACKENDS
from uibk_embedding.encoder.remote import (
    DENSE_WEIGHT_HEADER,
    FORMAT_HEADER,
    MEDIA_TYPE,
    check_api_key,
    format_id,
    pack_payload,
)
from uibk_embedding.encoder.shared import MAX_WAIT_MS, Histogram, SharedEncoder
from uibk_embedding.errors import InvalidInput
from uibk_embedding.tagged import DIM, N_SLOTS, check_dense_weight, check_text, dense_vector

DEFAULT_PORT = 8765
DENSE_DIM = N_SLOTS * (DIM - 1)  # /v1/embeddings: the 381-d dense sentence vector
MAX_CLIENT_IDS = 1024  # distinct X-UIBK-Client ids remembered for /stats (the most recent)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
log = logging.getLogger("uibk_embedding.serve")


def public_model_name(name: str) -> str:
    """What ``/health`` says of the model: the embedded name, or a folder's last part (a server
    path tells a caller about the server's file system and nothing about the model).

    >>> public_model_name("/srv/models/uibk-v1"), public_model_name("embedded:all-MiniLM-L6-v2")
    ('uibk-v1', 'embedded:all-MiniLM-L6-v2')
    """
    return name if ":" in name and not os.path.isabs(name) else (Path(name).name or name)


_WS = re.compile(r"[ \t\n\r]*")
_JSON_TYPES = {"{": "a JSON object", "[": "a JSON list", '"': "a string", "t": "a boolean", "f": "a boolean",
               "n": "null"}


class RequestRefused(ValueError):
    """A request body :func:`parse_request` refuses: ``status`` (400 or 413) and the message."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def _json_type(doc: str, pos: int) -> str:
    c = doc[pos:pos + 1]
    return _JSON_TYPES.get(c, "a number" if c and c in "-0123456789" else "nothing")


def parse_request(body: bytes | bytearray, *, max_texts: int = 1024,
                  max_text_chars: int = 100_000) -> tuple[str, list[str], float | None]:
    """``(kind, texts, dense_weight)`` of an ``/encode`` body, building no other Python object.

    The body must be one JSON object with the keys ``kind`` (``"documents"`` or ``"queries"``),
    ``texts`` (a list of strings) and ``dense_weight`` (a number or null, optional) and no other.
    It is read left to right and refused (:class:`RequestRefused`, status 400; 413 past
    ``max_texts`` texts) at the first thing that does not fit, so that junk (another key, a list
    of objects, deep nesting) is never parsed. A text longer than ``max_text_chars`` characters
    is cut to that many (then truncated at the token limit, as in-process).

    >>> parse_request(b'{"kind": "queries", "texts": ["a wing"], "dense_weight": 2}')
    ('queries', ['a wing'], 2.0)
    >>> parse_request(b'{"kind": "documents", "texts": [{}, {}]}')
    Traceback (most recent call last):
    ...
    uibk_embedding.encoder.server.RequestRefused: texts[0] must be a string, got a JSON object
    >>> try:
    ...     parse_request(b'{"kind": "documents", "texts": ["a"], "junk": [[[[]]]]}')
    ... except RequestRefused as e:
    ...     print(e.status, e)
    400 unknown key 'junk': a request takes only 'kind', 'texts' and 'dense_weight'
    """
    got = _read_object(body, {"kind": "'documents' or 'queries'", "texts": "a list of strings",
                              "dense_weight": "a number or null"}, "texts", max_texts, max_text_chars)
    kind = got.get("kind")
    if kind not in ("documents", "queries"):
        raise RequestRefused(400, f"'kind' must be 'documents' or 'queries', got {kind!r}")
    if "texts" not in got:
        raise RequestRefused(400, "'texts' must be a list of strings, got nothing")
    return kind, got["texts"], got.get("dense_weight")


class Texts(list):
    """The texts of a request, and ``cut``: the positions of those the parser cut to
    ``max_text_chars``."""

    def __init__(self) -> None:
        super().__init__()
        self.cut: set[int] = set()


def _text(raw: str, max_text_chars: int, where: str, texts: Texts) -> str:
    """One text of a request: cut, not refused, when over-long (see "Text length" in the module
    docstring; its position goes into ``texts.cut``); refused (400) when empty or not valid Unicode (a lone
    surrogate, which the tokenizer would fail on, failing every request encoded with it)."""
    text = cut_text(raw, max_text_chars)
    if len(text) < len(raw):
        texts.cut.add(len(texts))  # the position it is appended at
    if not text.strip():
        raise RequestRefused(400, f"{where} is empty or whitespace only; there is nothing to encode")
    try:
        return check_text(text, where)
    except InvalidInput as e:
        raise RequestRefused(400, str(e)) from None


def _parse_texts(doc: str, pos: int, max_texts: int, max_text_chars: int,
                 name: str = "texts") -> tuple[Texts, int]:
    if doc[pos:pos + 1] != "[":
        raise RequestRefused(400, f"'{name}' must be a list of strings, got {_json_type(doc, pos)}")
    texts = Texts()
    pos = _WS.match(doc, pos + 1).end()
    if doc[pos:pos + 1] == "]":
        return texts, pos + 1
    while True:
        if len(texts) == max_texts:
            raise RequestRefused(413, f"more than {max_texts} texts in one request; this server accepts "
                                      f"at most {max_texts}")
        if doc[pos:pos + 1] != '"':
            raise RequestRefused(400, f"{name}[{len(texts)}] must be a string, got {_json_type(doc, pos)}")
        text, pos = scanstring(doc, pos + 1, True)
        texts.append(_text(text, max_text_chars, f"{name}[{len(texts)}]", texts))
        pos = _WS.match(doc, pos).end()
        c = doc[pos:pos + 1]
        if c == "]":
            return texts, pos + 1
        if c != ",":
            raise RequestRefused(400, "the request body is not JSON as expected: ',' or ']' after "
                                      f"{name}[{len(texts) - 1}] at character {pos}, "
                                      f"found {doc[pos:pos + 10]!r}")
        pos = _WS.match(doc, pos + 1).end()


_OPENAI_KEYS = {"input": "a string or a list of strings", "model": "a string or null",
                "encoding_format": "a string or null", "user": "a string or null",
                "dimensions": "a number or null"}


def parse_embeddings_request(body: bytes | bytearray, *, max_texts: int = 1024,
                             max_text_chars: int = 100_000) -> tuple[list[str], str | None, str]:
    """``(texts, model, encoding_format)`` of an OpenAI ``POST /v1/embeddings`` body, read as
    strictly as :func:`parse_request`: the keys ``input`` (a string or a list of strings),
    ``model`` (a string, echoed), ``encoding_format`` (``"float"``, the default, or ``"base64"``),
    ``user`` (a string, ignored) and ``dimensions`` (only the vector's own size, 381), no other.

    >>> parse_embeddings_request(b'{"input": "a wing", "model": "uibk"}')
    (['a wing'], 'uibk', 'float')
    >>> parse_embeddings_request(b'{"input": [1, 2]}')
    Traceback (most recent call last):
    ...
    uibk_embedding.encoder.server.RequestRefused: input[0] must be a string, got a number
    """
    got = _read_object(body, _OPENAI_KEYS, "input", max_texts, max_text_chars)
    if "input" not in got:
        raise RequestRefused(400, "'input' must be a string or a list of strings, got nothing")
    fmt = got.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise RequestRefused(400, f"'encoding_format' must be 'float' or 'base64', got {fmt!r}")
    dims = got.get("dimensions")
    if dims is not None and dims != DENSE_DIM:
        raise RequestRefused(400, f"'dimensions' must be {DENSE_DIM} (the dense vector's size), got {dims:g}")
    return got["input"], got.get("model"), fmt


def _read_object(body: bytes | bytearray, keys: Mapping[str, str], texts_key: str, max_texts: int,
                 max_text_chars: int) -> dict[str, Any]:
    """The one reader of both JSON bodies (``/encode``, ``/v1/embeddings``): one flat object of
    ``keys`` (key -> what its value must be, said in the error), read left to right and refused
    (:class:`RequestRefused`) at the first thing that does not fit, building no other Python
    object. ``texts_key`` is a list of strings (:func:`_parse_texts`), or a single string when
    ``keys`` says so; a value described as ``"a number..."`` is a number (or null when it says
    so), any other a string (null when it says ``"or null"``); anything else is refused with its
    JSON type."""
    try:
        doc = body.decode(json.detect_encoding(body))
    except (UnicodeDecodeError, LookupError) as e:
        raise RequestRefused(400, f"the request body is not JSON ({e})") from None
    try:
        return _parse_object(doc, keys, texts_key, max_texts, max_text_chars)
    except json.JSONDecodeError as e:  # a malformed string or number: its message, not its .doc
        raise RequestRefused(400, f"the request body is not JSON ({e.msg} at character {e.pos})") from None


def _parse_object(doc: str, keys: Mapping[str, str], texts_key: str, max_texts: int,
                  max_text_chars: int) -> dict[str, Any]:
    def expect(pos: int, chars: str, what: str) -> int:
        pos = _WS.match(doc, pos).end()
        if doc[pos:pos + 1] not in tuple(chars):
            raise RequestRefused(400, f"the request body is not JSON as expected: {what} at character "
                                      f"{pos}, found {doc[pos:pos + 10]!r}")
        return pos

    def refuse(key: str, pos: int) -> RequestRefused:
        return RequestRefused(400, f"{key!r} must be {keys[key]}, got {_json_type(doc, pos)}")

    names = [repr(k) for k in keys]
    got: dict[str, Any] = {}
    pos = expect(0, "{", f"a JSON object with {texts_key!r}") + 1
    if doc[_WS.match(doc, pos).end():].startswith("}"):
        pos = _WS.match(doc, pos).end()
    else:
        while True:
            pos = expect(pos, '"', "a key in double quotes")
            key, pos = scanstring(doc, pos + 1, True)
            if key not in keys:
                raise RequestRefused(400, f"unknown key {key[:40]!r}: a request takes only "
                                          f"{', '.join(names[:-1])} and {names[-1]}")
            if key in got:
                raise RequestRefused(400, f"the key {key!r} appears twice")
            pos = _WS.match(doc, expect(pos, ":", "':'") + 1).end()
            c, wants = doc[pos:pos + 1], keys[key]
            if key == texts_key and c == "[":
                got[key], pos = _parse_texts(doc, pos, max_texts, max_text_chars, texts_key)
            elif c == '"' and not wants.startswith(("a number", "a list")):
                got[key], pos = scanstring(doc, pos + 1, True)
                if key == texts_key:  # one string: as one text of a list
                    one = Texts()
                    one.append(_text(got[key], max_text_chars, key, one))
                    got[key] = one
            elif key == texts_key:
                raise refuse(key, pos)
            elif doc.startswith("null", pos) and wants.endswith("or null"):
                got[key], pos = None, pos + 4
            elif (number := NUMBER_RE.match(doc, pos)) is not None and wants.startswith("a number"):
                got[key], pos = float(number.group()), number.end()
            else:
                raise refuse(key, pos)
            pos = expect(pos, ",}", "',' or '}'")
            if doc[pos] == "}":
                break
            pos += 1
    if _WS.match(doc, pos + 1).end() != len(doc):
        raise RequestRefused(400, "the request body is not JSON as expected: extra data at character "
                                  f"{pos + 1}")
    return got


def wants_json(accept: str) -> bool:
    """Whether an ``Accept`` header asks ``/encode`` for JSON rather than the binary payload.

    >>> wants_json("application/json"), wants_json(""), wants_json("application/x-uibk-vectors, */*")
    (True, False, False)
    """
    types = [t.split(";")[0].strip().lower() for t in accept.split(",")]
    return "application/json" in types and MEDIA_TYPE not in types


class _Limits:
    def __init__(self, max_texts: int, max_text_chars: int, max_body_bytes: int) -> None:
        if min(max_texts, max_text_chars, max_body_bytes) < 1:
            raise ValueError("request limits must be positive")
        self.max_texts = int(max_texts)
        self.max_text_chars = int(max_text_chars)
        self.max_body_bytes = int(max_body_bytes)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def vector_bound(encoder: Any) -> Callable[[Sequence[str], bool], int]:
    """An upper bound of the rows (3 slots + token vectors) ``encoder`` returns for texts, as a
    function ``bound(texts, is_query)``: what ``/encode`` admits a request by.

    A text's own tokens are at most its characters (four times that when not ASCII: byte-level
    tokenizers); what the encoder adds to them, its markers, prompts and query padding (PyLate pads
    queries with ``[MASK]`` to its query length), is measured once on the one-character text
    ``"a"``, and the most token rows a query can have on a long query. So a text counts
    ``3 + min(cap, max(1, characters) + added)``, ``cap`` the document length or the largest query.

    >>> from uibk_embedding.encoder import load_encoder
    >>> enc = load_encoder(); bound = vector_bound(enc)
    >>> texts = ["a", "wing lift in a propeller slipstream", "Flügel"]
    >>> all(bound([t], q) >= len(enc.encode_queries([t])[0] if q else enc.encode_documents([t])[0])
    ...     for t in texts for q in (True, False))
    True
    """
    one = {True: len(encoder.encode_queries(["a"])[0]), False: len(encoder.encode_documents(["a"])[0])}
    added = {kind: max(0, rows - 3 - 1) for kind, rows in one.items()}
    with warnings.catch_warnings():  # the probe is cut on purpose: no truncation notice for it
        warnings.filterwarnings("ignore", message=r".* were longer than \d+ tokens and were truncated")
        longest = len(encoder.encode_queries(["a " * (4 * int(encoder.query_token_cap) + 64)])[0]) - 3
    caps = {True: max(int(encoder.query_token_cap), longest, one[True] - 3),
            False: max(int(encoder.doc_max_length), one[False] - 3)}

    def bound(texts: Sequence[str], is_query: bool) -> int:
        cap, extra = caps[is_query], added[is_query]
        return sum(3 + min(cap, max(1, len(t) if t.isascii() else 4 * len(t)) + extra) for t in texts)

    return bound


def create_app(shared: SharedEncoder, *, max_texts: int = 1024, max_text_chars: int = 100_000,
               max_body_bytes: int = 32 * 2**20, api_key: str | None = None,
               max_concurrent: int = 64, body_timeout: float = 30.0,
               max_queued_bytes: int = 256 * 2**20, max_queued_texts: int = 8192,
               max_queued_vectors: int = 2**22) -> Any:
    """The FastAPI application serving ``shared`` (see the module docstring for the endpoints).

    ``api_key``: required as ``Authorization: Bearer KEY`` on every endpoint but ``/health``;
    ``max_concurrent``: ``/encode`` requests served (queued or encoding) at once, the rest 429;
    ``body_timeout``: seconds to receive a request body (a slow client is cut with 408);
    ``max_queued_bytes`` / ``max_queued_texts``: the request bodies being received plus the
    texts waiting for (or in) the encoder, in all requests together (at least one full request:
    ``max_body_bytes`` and ``max_texts``); a request past either answers 429 with Retry-After;
    ``max_queued_vectors``: token vectors (an upper bound per text) of the requests admitted and
    not yet answered in full; past it 429, unless no other request holds vectors.
    """
    require("fastapi", "serve", "uibk-embed serve")
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

    # (no "from __future__ import annotations" here: FastAPI reads the Request annotation)
    limits = _Limits(max_texts, max_text_chars, max_body_bytes)
    if int(max_concurrent) < 1 or not body_timeout > 0:
        raise ValueError("max_concurrent and body_timeout must be positive")
    if int(max_queued_bytes) < limits.max_body_bytes or int(max_queued_texts) < limits.max_texts:
        raise ValueError(f"max_queued_bytes ({max_queued_bytes}) and max_queued_texts ({max_queued_texts}) "
                         f"must hold at least one full request ({limits.max_body_bytes} bytes, "
                         f"{limits.max_texts} texts)")
    if int(max_queued_vectors) < 1:
        raise ValueError("max_queued_vectors must be positive")
    if api_key is not None and len(api_key) < 16:
        raise ValueError("the API key must be at least 16 characters long")
    if api_key is not None:
        check_api_key(api_key)  # what a client can send in a header: printable ASCII
    key = api_key.encode() if api_key else None
    # no /docs, /redoc (their scripts come from a CDN); /openapi.json is served below, behind the key
    app = FastAPI(title="uibk-embed", description="tagged multi-vector encoder", docs_url=None,
                  redoc_url=None, openapi_url=None)
    clients: OrderedDict[str, None] = OrderedDict()
    enc = shared.encoder
    bound_vectors = vector_bound(enc)  # what a request's answer may hold, markers and padding included
    model_format = format_id(shared.format)
    m: dict[str, Any] = {"in_flight": 0, "queued_bytes": 0, "queued_texts": 0, "queued_vectors": 0,
                         "status": {}, "texts": 0,
                         "token_vectors": 0, "latency": Histogram(LATENCY_BUCKETS)}

    def error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
        m["status"][status] = m["status"].get(status, 0) + 1
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    def authorised(request: Request) -> bool:
        if key is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key)

    def unauthorised() -> JSONResponse:
        return error(401, "this server needs an API key: send 'Authorization: Bearer KEY' "
                          "(RemoteEncoder(url, api_key=...) or $UIBK_API_KEY)",
                     {"WWW-Authenticate": "Bearer"})

    @app.get("/health", response_model=None)
    def health() -> dict[str, Any] | JSONResponse:
        report = {
            "service": "uibk-embed",
            "status": "ok",
            "auth": key is not None,
            "model": public_model_name(shared.model_name),
            "kind": enc.kind,
            "device": shared.device,
            "backend": getattr(enc, "backend", "torch"),
            "format": shared.format.to_stored(),
            "dense_weight": enc.dense_weight,
            "dim": DIM,
            "query_token_cap": enc.query_token_cap,
            "query_max_length": enc.query_max_length,
            "doc_max_length": enc.doc_max_length,
            "limits": limits.as_dict(),
        }
        if shared.worker_error is not None:  # nothing is encoded any more: not healthy
            e = shared.worker_error
            report.update(status="failed", error=f"the encoder's worker thread failed ({type(e).__name__}); "
                                                 "restart the server (the error is in its log)")
            return JSONResponse(report, status_code=503)
        return report

    @app.get("/openapi.json", include_in_schema=False, response_model=None)
    def openapi(request: Request) -> dict[str, Any] | JSONResponse:
        if not authorised(request):
            return unauthorised()
        return app.openapi()

    @app.get("/stats", response_model=None)
    def stats(request: Request) -> dict[str, Any] | JSONResponse:
        if not authorised(request):
            return unauthorised()
        return {**shared.stats(), "clients": len(clients)}

    @app.get("/metrics", response_model=None)
    def metrics(request: Request) -> PlainTextResponse | JSONResponse:
        if not authorised(request):
            return unauthorised()
        s = shared.stats()
        lines = ["# TYPE uibk_requests_total counter"]
        lines += [f'uibk_requests_total{{status="{code}"}} {n}' for code, n in sorted(m["status"].items())]
        lines += ["# TYPE uibk_texts_total counter", f"uibk_texts_total {m['texts']}",
                  "# TYPE uibk_token_vectors_total counter", f"uibk_token_vectors_total {m['token_vectors']}",
                  "# TYPE uibk_requests_in_flight gauge", f"uibk_requests_in_flight {m['in_flight']}",
                  "# TYPE uibk_queued_bytes gauge", f"uibk_queued_bytes {m['queued_bytes']}",
                  "# TYPE uibk_queued_texts gauge", f"uibk_queued_texts {m['queued_texts']}",
                  "# TYPE uibk_queued_vectors gauge", f"uibk_queued_vectors {m['queued_vectors']}",
                  "# TYPE uibk_encoder_queue_depth gauge", f"uibk_encoder_queue_depth {shared.queue_depth()}",
                  "# TYPE uibk_forward_passes_total counter", f"uibk_forward_passes_total {s['passes']}",
                  "# TYPE uibk_request_seconds histogram", *m["latency"].lines("uibk_request_seconds"),
                  "# TYPE uibk_pass_texts histogram", *shared.pass_sizes.lines("uibk_pass_texts")]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @app.post("/encode")
    async def encode(request: Request) -> Response:
        return await serve_encoding(request, openai=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await serve_encoding(request, openai=True)

    async def serve_encoding(request: Request, openai: bool) -> Response:
        if not authorised(request):
            return unauthorised()
        if m["in_flight"] >= max_concurrent:
            return error(429, f"this server encodes at most {max_concurrent} requests at once; retry "
                              "after the time in Retry-After", {"Retry-After": "1"})
        m["in_flight"] += 1
        t0 = time.perf_counter()
        held = {"bytes": 0, "texts": 0, "vectors": 0}  # what this request counts in the budgets
        try:
            response = await _encode(request, held, openai)
        finally:
            m["in_flight"] -= 1
            m["queued_bytes"] -= held["bytes"]
            m["queued_texts"] -= held["texts"]
            if not held.get("until_sent"):
                release_vectors(held)
        m["status"][response.status_code] = m["status"].get(response.status_code, 0) + (
            response.status_code == 200)
        m["latency"].observe(time.perf_counter() - t0)
        return response

    def busy(what: str) -> JSONResponse:
        return error(429, f"this server holds {what} of queued requests, its limit; retry after the "
                          "time in Retry-After", {"Retry-After": "1"})

    def release_vectors(held: dict[str, int]) -> None:
        # a no-op once released: the finalizer below may run later, in another thread (GC)
        n, held["vectors"] = held["vectors"], 0
        if n:
            m["queued_vectors"] -= n

    class _Holding:
        """An answer of vectors: the request's token vectors stay counted until it is sent."""

        def __init__(self, content: Any, held: dict[str, int], **kwargs: Any) -> None:
            super().__init__(content, **kwargs)
            held["until_sent"] = 1
            # a backstop: an answer dropped unsent (its task cancelled) still frees its vectors
            weakref.finalize(self, release_vectors, held)
            self._held = held

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                release_vectors(self._held)

    class _Answer(_Holding, Response):
        """The binary (or a small JSON) answer, built whole."""

    class _StreamedAnswer(_Holding, StreamingResponse):
        """The JSON answer of ``/encode``: Starlette runs its generator in a worker thread, one
        slice at a time, each sent before the next is made."""

    def hold_bytes(held: dict[str, int], n: int) -> bool:
        """Count ``n`` bytes for this request (its total so far); False when past the budget."""
        extra = n - held["bytes"]
        if extra > 0 and m["queued_bytes"] + extra > max_queued_bytes:
            return False
        m["queued_bytes"] += extra
        held["bytes"] = n
        return True

    async def _read_body(request: Request, held: dict[str, int]) -> bytearray | JSONResponse:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return error(413, f"request body of {declared} bytes exceeds the limit of "
                              f"{limits.max_body_bytes} bytes; send fewer texts per request")
        if declared and declared.isdigit() and not hold_bytes(held, int(declared)):
            return busy(f"{m['queued_bytes']} bytes")
        body = bytearray()
        deadline = time.monotonic() + body_timeout
        stream = request.stream().__aiter__()
        while True:
            left = deadline - time.monotonic()
            try:
                part = await asyncio.wait_for(stream.__anext__(), timeout=max(left, 0.001))
            except StopAsyncIteration:
                return body
            except TimeoutError:
                return error(408, f"the request body did not arrive within {body_timeout:g} s")
            body += part
            if len(body) > limits.max_body_bytes:
                return error(413, f"request body exceeds the limit of {limits.max_body_bytes} bytes; "
                                  "send fewer texts per request")
            if len(body) > held["bytes"] and not hold_bytes(held, len(body)):
                return busy(f"{m['queued_bytes']} bytes")

    async def _encode(request: Request, held: dict[str, int], openai: bool) -> Response:
        body = await _read_body(request, held)
        if isinstance(body, JSONResponse):
            return body
        try:  # only the list of texts outlives this: not the body, not any junk in it
            if openai:
                texts, model, fmt = parse_embeddings_request(body, max_texts=limits.max_texts,
                                                             max_text_chars=limits.max_text_chars)
                kind, w = "documents", None
            else:
                kind, texts, w = parse_request(body, max_texts=limits.max_texts,
                                               max_text_chars=limits.max_text_chars)
        except RequestRefused as e:
            return error(e.status, str(e))
        finally:
            del body
        # while queued, the request holds its texts (not its body) in the budgets
        m["queued_bytes"] -= held["bytes"]
        held["bytes"] = 0
        if not hold_bytes(held, sum(map(len, texts))):
            return busy(f"{m['queued_bytes']} bytes")
        if m["queued_texts"] + len(texts) > max_queued_texts:
            return busy(f"{m['queued_texts']} texts")
        m["queued_texts"] += len(texts)
        held["texts"] = len(texts)
        vectors = bound_vectors(texts, kind == "queries")
        if m["queued_vectors"] and m["queued_vectors"] + vectors > max_queued_vectors:
            return busy(f"{m['queued_vectors']} token vectors")
        m["queued_vectors"] += vectors
        held["vectors"] = vectors
        if kind == "documents" and w is not None:
            return error(400, "'dense_weight' applies to queries only")
        if kind == "queries":
            try:
                w = check_dense_weight(enc.dense_weight if w is None else w)
            except ValueError as e:
                return error(400, str(e))
        client = request.headers.get("x-uibk-client", "")[:128]
        if client:
            clients[client] = None
            clients.move_to_end(client)
            while len(clients) > MAX_CLIENT_IDS:
                clients.popitem(last=False)
        try:
            fut = shared.submit(texts, is_query=kind == "queries", dense_weight=float(w or 1.0),
                                client=client)
            waiting = asyncio.wrap_future(fut)
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=0.05)
                if not waiting.done() and await request.is_disconnected():
                    fut.cancel()  # still queued: dropped before the model; running: finishes
                    waiting.cancel()
                    return error(499, "the client closed the connection")
            res = waiting.result()
        except asyncio.CancelledError:
            return error(499, "the client closed the connection")
        except Exception:  # the model failed: the client must know, nothing half-done
            log.exception("encoding failed")
            return error(500, "encoding failed on the server (the error is in the server's log)")
        m["texts"] += len(res)
        actual = sum(len(a) for a in res)
        m["token_vectors"] += actual - 3 * len(res)
        m["queued_vectors"] += actual - held["vectors"]  # the bound, now the real count, until sent
        held["vectors"] = actual
        truncated = len(res.cut | texts.cut)  # each text once, cut by the parser, the tokenizer or both
        # the format and default dense weight of every answer: a client checks them against what it
        # read from /health, so that a server restarted with another model is not taken for the first
        headers = {"X-UIBK-Truncated": str(truncated), FORMAT_HEADER: model_format,
                   DENSE_WEIGHT_HEADER: repr(float(enc.dense_weight))}
        if openai:  # small (a 381-d vector a text), but not built on the event loop either
            name = model or public_model_name(shared.model_name)
            content = await asyncio.to_thread(lambda: json.dumps(_openai_answer(res, name, fmt)).encode())
            return _Answer(content, held, media_type="application/json", headers=headers)
        if wants_json(request.headers.get("accept", "")):  # written in slices, in a worker thread
            return _StreamedAnswer(_json_answer(kind, truncated, res), held, media_type="application/json",
                                   headers=headers)
        return _Answer(pack_payload(res), held, media_type=MEDIA_TYPE, headers=headers)

    return app


JSON_SLICE = 64  # token vectors a JSON answer writes at a time (about 180 KB of text)


def _json_answer(kind: str, truncated: int, res: Sequence[np.ndarray]) -> Iterator[bytes]:
    """The JSON answer of ``/encode`` (``{"kind", "dim", "truncated", "vectors"}``, the bytes of
    ``json.dumps``) in pieces of about 256 KB, made from ``JSON_SLICE`` vectors at a time: its
    text (about 2.8 KB a vector) and its Python floats (4 KB) never exist whole, so it holds no
    more memory than the binary answer does, beyond a slice.

    >>> b"".join(_json_answer("queries", 0, [np.zeros((1, 2), np.float32)]))
    b'{"kind": "queries", "dim": 128, "truncated": 0, "vectors": [[[0.0, 0.0]]]}'
    """
    def pieces() -> Iterator[str]:
        yield f'{{"kind": {json.dumps(kind)}, "dim": {DIM}, "truncated": {int(truncated)}, "vectors": ['
        for t, a in enumerate(res):
            yield ", [" if t else "["
            for i in range(0, len(a), JSON_SLICE):
                part = json.dumps(np.asarray(a[i:i + JSON_SLICE], dtype=np.float32).tolist())[1:-1]
                yield ", " + part if i else part
            yield "]"
        yield "]}"

    buf: list[str] = []
    size = 0
    for piece in pieces():
        buf.append(piece)
        size += len(piece)
        if size >= 2**18:
            yield "".join(buf).encode()
            buf, size = [], 0
    yield "".join(buf).encode()


def _openai_answer(res: Sequence[Any], model: str, fmt: str) -> dict[str, Any]:
    """The OpenAI embeddings answer: each text's dense sentence vector (``dense_vector`` of its
    tagged document list), as floats or as base64 of float32 little-endian bytes."""
    data = []
    for i, tagged in enumerate(res):
        v = dense_vector(tagged).astype("<f4")
        emb: Any = base64.b64encode(v.tobytes()).decode() if fmt == "base64" else v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = sum(len(t) - N_SLOTS for t in res)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


@contextlib.contextmanager
def serve_subprocess(*args: str, startup_timeout: float = 300.0, port: int | None = None) -> Iterator[str]:
    """Run ``uibk-embed serve ARGS`` in a child process on a free local port (or ``port``); yield its URL once
    ``/health`` answers, stop the child (terminate, then kill) on exit. A child that exits or
    stays unhealthy past ``startup_timeout`` seconds raises ``RuntimeError`` (with its output when it exited).

    >>> with serve_subprocess("--device", "cpu") as url:  # doctest: +SKIP
    ...     RemoteEncoder(url).encode_documents(["a wing"])[0].shape[1]
    128
    """
    import socket
    import subprocess
    import tempfile
    import time

    httpx = require("httpx", "serve", "serve_subprocess")
    if port is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uibk_embedding.encoder.server",
                                 "--port", str(port), *args], stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + startup_timeout  # importing torch on a busy machine is slow
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"uibk-embed serve exited with {proc.returncode}: "
                                       f"{log.read()[-3000:]}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"uibk-embed serve did not answer /health within "
                                       f"{startup_timeout:g} s")
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _number(kind: type, low: float, high: float | None = None, *, above: bool = False) -> Any:
    """An argparse type: a ``kind`` number at least ``low`` (above it with ``above``), at most ``high``.

    >>> _number(int, 1)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be at least 1, got 0
    """
    def parse(text: str) -> Any:
        try:
            x = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not (x > low if above else x >= low) or (high is not None and x > high) or x != x:
            bound = f"above {low:g}" if above else f"at least {low:g}"
            bound += f" and at most {high:g}" if high else ""
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return x
    return parse


def head_timeout_protocol(seconds: float) -> type:
    """uvicorn's h11 protocol plus the timeout it lacks: a connection that has sent no whole
    request head ``seconds`` after it opened, or after its last answer, is closed (uvicorn keeps a
    connection that sent nothing, or half a head, open for good; its keep-alive timeout starts only
    after an answer and stops at the first byte).

    >>> head_timeout_protocol(30.0).__name__
    'HeadTimeoutH11Protocol'
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._wait_for_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._head_seen()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._wait_for_head()
            self._head_seen()  # a pipelined request may have been read already

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def _wait_for_head(self) -> None:
            if self._head_timer is None and not self.transport.is_closing():
                self._head_timer = self.loop.call_later(seconds, self._head_timed_out)

        def _head_seen(self) -> None:
            if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadTimeoutH11Protocol


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="uibk-embed serve",
                                description="serve one shared encoder over HTTP")
    p.add_argument("--encoder", default=None,
                   help="encoder folder (default: the embedded all-MiniLM-L6-v2 model)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let a PyLate model folder run the Python code it ships (read it first)")
    p.add_argument("--revision", default=None,
                   help="branch, tag or commit of a Hugging Face Hub id given as --encoder")
    p.add_argument("--encoder-backend", choices=BACKENDS, default="torch",
                   help="what runs the embedded default's network: torch (default), onnx (ONNX Runtime) or "
                        "openvino (OpenVINO), on the CPU, the same lists within float32 noise, or "
                        "openvino-bf16 (bfloat16 where the CPU has it; within 0.3 nDCG@10 points: "
                        "docs/loading.md)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_number(int, 0, 65535), default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: CUDA when present)")
    p.add_argument("--max-wait-ms", type=_number(float, 0, MAX_WAIT_MS), default=5.0,
                   help="how long to wait for more requests to batch together")
    p.add_argument("--batch-tokens", type=_number(int, 1), default=None,
                   help="padded tokens per forward pass")
    p.add_argument("--max-texts", type=_number(int, 1), default=1024, help="texts per request at most")
    p.add_argument("--max-text-chars", type=_number(int, 1, 10**8), default=100_000,
                   help="a longer text is cut to this many characters before tokenizing (then truncated "
                        "at the token limit, as in-process; default 100000)")
    p.add_argument("--max-body-mb", type=_number(float, 0, 2**16, above=True), default=32.0,
                   help="request body size limit")
    p.add_argument("--threads", type=_number(int, 1), default=None,
                   help="CPU threads for torch (and ONNX Runtime or OpenVINO with --encoder-backend)")
    p.add_argument("--api-key-file", default=None,
                   help="file holding the API key that clients must send as 'Authorization: Bearer KEY' "
                        "(default: $UIBK_API_KEY; none: no authentication, fine on 127.0.0.1). A key "
                        "on the command line would show in the process list, so it is read from a file")
    p.add_argument("--max-concurrent-requests", type=_number(int, 1, 10**5), default=64,
                   help="requests served at once; more answer 429 with Retry-After")
    p.add_argument("--body-timeout-s", type=_number(float, 0, 86_400, above=True), default=30.0,
                   help="seconds to receive a request body (slow clients get 408), and a request head "
                        "(a connection that has sent no whole head this long after it opened, or after "
                        "its last answer, is closed)")
    p.add_argument("--idle-timeout-s", type=_number(float, 0, 86_400), default=5.0,
                   help="seconds an idle keep-alive connection stays open")
    p.add_argument("--max-queued-mb", type=_number(float, 0, 2**20, above=True), default=256.0,
                   help="request bodies being received plus texts waiting for the encoder, all requests "
                        "together; more answer 429 (at least --max-body-mb)")
    p.add_argument("--max-queued-texts", type=_number(int, 1, 10**9), default=8192,
                   help="texts waiting for the encoder, all requests together; more answer 429")
    p.add_argument("--max-queued-vectors", type=_number(int, 1, 10**12), default=2**22,
                   help="token vectors (an upper bound per text) of the requests not yet answered in full, "
                        "all together; more answer 429 (1 KiB of memory each)")
    p.add_argument("--log-level", default="warning", choices=LOG_LEVELS,
                   help="uvicorn's log level (default warning)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``uibk-embed serve``: load the encoder, print the address, serve until interrupted.

    >>> main(["--help"])  # doctest: +SKIP
    """
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    uvicorn = require("uvicorn", "serve", "uibk-embed serve")
    key = os.environ.get("UIBK_API_KEY", "").strip() or None  # a newline from `echo` is no part of it
    where = "the API key in $UIBK_API_KEY"
    if args.api_key_file:
        where = f"the API key in {args.api_key_file}"
        try:
            key = Path(args.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"uibk-embed serve: cannot read the API key file {args.api_key_file}: "
                             f"{getattr(e, 'strerror', None) or e}") from None
    if key is not None:  # refused before the encoder loads: a key no client could send, or too short
        try:
            check_api_key(key, where)
        except ValueError as e:
            raise SystemExit(f"uibk-embed serve: {e}") from None
        if len(key) < 16:
            raise SystemExit(f"uibk-embed serve: {where} must be at least 16 characters long")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    options: dict[str, Any] = {"trust_remote_code": True} if args.trust_remote_code else {}
    if args.revision:
        options["revision"] = args.revision
    device = args.device
    if args.encoder_backend != "torch":  # ONNX Runtime runs on the CPU: not CUDA when present
        options.update(backend=args.encoder_backend, num_threads=args.threads)
        device = device or "cpu"
    try:
        shared = SharedEncoder(args.encoder, device=device, batch_tokens=args.batch_tokens,
                               max_wait_ms=args.max_wait_ms, show_progress=False, **options)
    except (RuntimeError, ValueError, OSError, ImportError) as e:  # a device torch lacks, a folder that
        # is none, the onnx extra missing
        raise SystemExit(f"uibk-embed serve: cannot load the encoder: {str(e).splitlines()[0]}") from None
    if key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"uibk-embed serve: WARNING: listening on {args.host} without an API key: anyone who can "
              "reach this port can use the encoder (--api-key-file, $UIBK_API_KEY)", file=sys.stderr)
    try:
        app = create_app(shared, max_texts=args.max_texts, max_text_chars=args.max_text_chars,
                         max_body_bytes=int(args.max_body_mb * 2**20), api_key=key,
                         max_concurrent=args.max_concurrent_requests, body_timeout=args.body_timeout_s,
                         max_queued_bytes=int(args.max_queued_mb * 2**20),
                         max_queued_texts=args.max_queued_texts,
                         max_queued_vectors=args.max_queued_vectors)
    except ValueError as e:
        shared.close()
        raise SystemExit(f"uibk-embed serve: {e}") from None
    try:  # the address is free (as uvicorn binds it): said before "listening", not after it
        with socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))
    except OSError as e:
        shared.close()
        raise SystemExit(f"uibk-embed serve: cannot listen on {args.host}:{args.port}: "
                         f"{e.strerror or e}") from None
    on = shared.device if args.encoder_backend == "torch" else f"{shared.device} ({args.encoder_backend})"
    print(f"uibk-embed serve: {shared.model_name} on {on}, "
          f"listening on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    timeout_keep_alive=args.idle_timeout_s, http=head_timeout_protocol(args.body_timeout_s))
    finally:
        shared.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
