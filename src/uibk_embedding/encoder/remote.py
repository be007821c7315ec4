"""A client of ``uibk-embed serve``: :class:`RemoteEncoder`, the encoder protocol over HTTP.

Many processes (indexing jobs, services) can share one GPU through one server: each holds a
``RemoteEncoder``; the server's :class:`~uibk_embedding.encoder.shared.SharedEncoder` batches
their requests together. The vectors travel as one binary float32 payload per request (the
format of :func:`pack_payload`), never as JSON lists of floats; they are the same bytes the
server's encoder produced.

Errors say what happened: :class:`ServerUnavailable` (nothing listening, timeout),
:class:`RemoteEncoderError` (the answer is not a valid payload, or the server failed), and
``ValueError`` / ``TypeError`` for bad input, as in-process.

Example
-------
>>> enc = RemoteEncoder("http://127.0.0.1:8765")  # doctest: +SKIP
>>> docs = enc.encode_documents(["a wing in a slipstream"])  # doctest: +SKIP
>>> packed = pack_payload([np.ones((4, 128), np.float32) / np.sqrt(128)])
>>> [a.shape for a in unpack_payload(packed)]
[(4, 128)]
"""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding.encoder.inputs import cut_text, text_chunks, validate_texts, warn_truncated
from uibk_embedding.errors import BackendUnavailable, UIBKError
from uibk_embedding.tagged import DIM, TaggedFormat, check_dense_weight

MAGIC = b"UIBKVEC1"
MEDIA_TYPE = "application/x-uibk-vectors"
_HEAD = struct.Struct("<8sII")  # magic, number of lists, dimension


class RemoteEncoderError(UIBKError, RuntimeError):
    """The server answered, but not with what the protocol promises."""


class ServerUnavailable(RemoteEncoderError, BackendUnavailable):
    """No uibk-embed server answered at the URL (refused, unreachable or timed out)."""


def pack_payload(arrays: Sequence[np.ndarray]) -> bytes:
    """Binary payload: magic, count, dim (uint32 LE), row counts (uint32 LE), float32 LE rows.

    >>> len(pack_payload([np.zeros((2, 128), np.float32)])) == 16 + 4 + 2 * 128 * 4
    True
    """
    rows = np.asarray([len(a) for a in arrays], dtype="<u4")
    body = [np.ascontiguousarray(a, dtype="<f4").reshape(-1, DIM).tobytes() for a in arrays]
    return b"".join([_HEAD.pack(MAGIC, len(arrays), DIM), rows.tobytes(), *body])


def unpack_payload(data: bytes, expected: int | None = None) -> list[np.ndarray]:
    """Read :func:`pack_payload` bytes back; any inconsistency raises :class:`RemoteEncoderError`.

    >>> unpack_payload(b"garbage")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.encoder.remote.RemoteEncoderError: malformed vector payload: 7 bytes, shorter ...
    """
    if len(data) < _HEAD.size:
        raise RemoteEncoderError(
            f"malformed vector payload: {len(data)} bytes, shorter than the {_HEAD.size}-byte header")
    magic, n, dim = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise RemoteEncoderError(f"malformed vector payload: starts with {magic!r}, not {MAGIC!r}")
    if dim != DIM:
        raise RemoteEncoderError(f"malformed vector payload: dimension {dim}, expected {DIM}")
    if expected is not None and n != expected:
        raise RemoteEncoderError(f"the server returned {n} lists for {expected} texts")
    off = _HEAD.size + 4 * n
    if len(data) < off:
        raise RemoteEncoderError(f"malformed vector payload: truncated in the row counts ({len(data)} bytes)")
    rows = np.frombuffer(data, dtype="<u4", count=n, offset=_HEAD.size).astype(np.int64)
    total = int(rows.sum())
    if len(data) != off + total * DIM * 4:
        raise RemoteEncoderError(
            f"malformed vector payload: {len(data)} bytes, the header announces {off + total * DIM * 4}")
    flat = np.frombuffer(data, dtype="<f4", offset=off).reshape(total, DIM)
    if not np.isfinite(flat).all():
        raise RemoteEncoderError("malformed vector payload: non-finite values")
    flat = flat.astype(np.float32)  # native, writable copy
    return list(np.split(flat, np.cumsum(rows)[:-1])) if n else []


class RemoteEncoder:
    """The encoder protocol served by ``uibk-embed serve`` at ``url``.

    Parameters
    ----------
    url: the server, e.g. ``"http://127.0.0.1:8765"``.
    timeout: seconds to wait for one request's vectors.
    connect_timeout: seconds to wait for a connection.
    show_progress: progress bar for long calls (None: on a terminal, 256 texts or more).
    request_texts: texts per request (default: the server's ``max_texts`` limit, at most 256).
    in_flight: requests one call keeps open at a time (default 2): a long list is sent as several
        requests, and while the server encodes one, the next is already on its way, so the
        server's worker does not idle during a round trip. Results keep the input order.
    api_key: sent as ``Authorization: Bearer KEY`` (default ``$UIBK_API_KEY``), for a server
        started with an API key. A busy server's 429 is retried after its ``Retry-After``
        (``retries_429`` times at most).

    On construction the client reads ``/health`` (format, dense weight, limits); a server that is
    down raises :class:`ServerUnavailable` there, with the command to start one.

    >>> RemoteEncoder("http://127.0.0.1:9", connect_timeout=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.encoder.remote.ServerUnavailable: no uibk-embed server at http://127.0.0.1:9 ...
    """

    def __init__(self, url: str | None = None, *, timeout: float = 300.0, connect_timeout: float = 10.0,
                 show_progress: bool | None = None, request_texts: int | None = None,
                 in_flight: int = 2, api_key: str | None = None, retries_429: int = 8) -> None:
        if request_texts is not None and int(request_texts) < 1:
            raise ValueError(f"request_texts must be at least 1, got {request_texts}")
        if int(in_flight) < 1:
            raise ValueError(f"in_flight must be at least 1, got {in_flight}")
        self.in_flight = int(in_flight)

        httpx = require("httpx", "serve", "RemoteEncoder")
        self.url = (url or os.environ.get("UIBK_ENCODER_URL") or "http://127.0.0.1:8765").rstrip("/")
        self.timeout = float(timeout)
        self.show_progress = show_progress
        self.client_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._httpx = httpx
        headers = {"X-UIBK-Client": self.client_id}
        key = (api_key if api_key is not None else os.environ.get("UIBK_API_KEY", "")).strip()
        if key:  # stripped: a key read from a file ends in a newline, which no header can carry
            headers["Authorization"] = f"Bearer {key}"
        self.retries_429 = int(retries_429)
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout, connect=connect_timeout), headers=headers)
        info = self.health()
        try:
            self.format = TaggedFormat.from_dict(info["format"])
            self.dense_weight = float(info["dense_weight"])
            self.model_name = str(info["model"])
            self.max_texts = int(info["limits"]["max_texts"])
            self.request_texts = min(self.max_texts, int(request_texts or 256))
            self.max_text_chars = int(info["limits"]["max_text_chars"])
            self.query_max_length = int(info["query_max_length"])
            self.doc_max_length = int(info["doc_max_length"])
        except (KeyError, TypeError, ValueError) as e:
            raise RemoteEncoderError(
                f"{self.url}/health is not the health report of a uibk-embed server ({e!r})") from None

    # -- HTTP ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kw: Any):
        httpx = self._httpx
        try:
            for attempt in range(self.retries_429 + 1):
                r = self._client.request(method, self.url + path, **kw)
                if r.status_code == 401:
                    raise RemoteEncoderError(
                        f"the uibk-embed server at {self.url} needs an API key: pass "
                        "RemoteEncoder(url, api_key=...) or set UIBK_API_KEY")
                if r.status_code != 429 or attempt == self.retries_429:
                    return r
                try:  # busy: wait as long as it asks (bounded), then again
                    wait = min(10.0, max(0.05, float(r.headers.get("Retry-After", "1"))))
                except ValueError:
                    wait = 1.0
                time.sleep(wait)
            return r
        except httpx.TimeoutException as e:
            raise ServerUnavailable(
                f"the uibk-embed server at {self.url} did not answer {path} within its timeout "
                f"({type(e).__name__}; timeout={self.timeout:g} s)") from None
        except httpx.TransportError as e:
            raise ServerUnavailable(
                f"no uibk-embed server at {self.url} ({type(e).__name__}: {e}); start one with "
                "`uibk-embed serve --encoder PATH --port PORT` or pass the right URL") from None

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` report (model, format, limits, device)."""
        r = self._request("GET", "/health")
        if r.status_code != 200:
            raise RemoteEncoderError(f"{self.url}/health answered HTTP {r.status_code}: "
                                     f"{r.text[:200]!r} (is this a uibk-embed server?)")
        try:
            info = r.json()
        except ValueError:
            raise RemoteEncoderError(f"{self.url}/health did not return JSON: {r.text[:200]!r} "
                                     "(is this a uibk-embed server?)") from None
        if not isinstance(info, dict) or info.get("service") != "uibk-embed":
            raise RemoteEncoderError(f"{self.url} is not a uibk-embed server (health: {str(info)[:200]})")
        return info

    def stats(self) -> dict[str, Any]:
        """The server's counters (``/stats``): requests, passes, merged passes, clients."""
        r = self._request("GET", "/stats")
        if r.status_code != 200:
            raise RemoteEncoderError(f"{self.url}/stats answered HTTP {r.status_code}")
        return r.json()

    def _post(self, texts: list[str], kind: str, w: float | None) -> tuple[list[np.ndarray], int]:
        body = json.dumps({"kind": kind, "texts": texts, "dense_weight": w}).encode()
        r = self._request("POST", "/encode", content=body,
                          headers={"Content-Type": "application/json", "Accept": MEDIA_TYPE})
        if r.status_code != 200:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text[:300]
            if r.status_code in (400, 413, 422):
                raise ValueError(f"the uibk-embed server refused the request: {detail}")
            raise RemoteEncoderError(f"the uibk-embed server at {self.url} failed "
                                     f"(HTTP {r.status_code}): {detail}")
        if r.headers.get("content-type", "").split(";")[0].strip() != MEDIA_TYPE:
            raise RemoteEncoderError(
                f"the server at {self.url} answered {r.headers.get('content-type')!r}, "
                f"not {MEDIA_TYPE}: {r.content[:80]!r}")
        arrays = unpack_payload(r.content, expected=len(texts))
        try:
            cut = int(r.headers.get("X-UIBK-Truncated", "0"))
        except ValueError:
            cut = 0
        return arrays, cut

    # -- the protocol ------------------------------------------------------------------------
    def encode_queries(self, texts: Sequence[str], *, dense_weight: float | None = None,
                       show_progress: bool | None = None) -> list[np.ndarray]:
        """Tagged query lists, computed by the server."""
        if dense_weight is not None:
            dense_weight = check_dense_weight(dense_weight)  # a float: numpy's would not go into JSON
        return self._encode(validate_texts(texts), "queries", dense_weight, show_progress)

    def encode_documents(self, texts: Sequence[str], *,
                         show_progress: bool | None = None) -> list[np.ndarray]:
        """Tagged document lists, computed by the server."""
        return self._encode(validate_texts(texts), "documents", None, show_progress)

    def encode_documents_iter(self, texts: Iterable[str], *, chunk_size: int = 256) -> Iterator[np.ndarray]:
        """Stream over any iterable of texts, ``chunk_size`` at a time (bounded memory)."""
        for chunk in text_chunks(texts, chunk_size):
            yield from self.encode_documents(chunk, show_progress=False)

    def _encode(self, texts: list[str], kind: str, w: float | None,
                show_progress: bool | None) -> list[np.ndarray]:
        if not texts:
            return []
        # an over-long text is not refused: cut here as the server would (a smaller body), then
        # truncated at the token limit and counted, as in-process (a warning)
        sent = [cut_text(t, self.max_text_chars) for t in texts]
        shortened = sum(len(s) < len(t) for s, t in zip(sent, texts, strict=True))
        texts = sent
        from tqdm.auto import tqdm

        progress = self.show_progress if show_progress is None else show_progress
        disable = {True: False, False: True}.get(progress, None if len(texts) >= 256 else True)
        step = self.request_texts
        chunks = [texts[i:i + step] for i in range(0, len(texts), step)]
        out: list[np.ndarray] = []
        cut = 0
        with tqdm(total=len(texts), desc=f"encoding {kind}", unit="text", disable=disable) as bar:
            if len(chunks) == 1 or self.in_flight == 1:
                answers = (self._post(c, kind, w) for c in chunks)
                for arrays, n_cut in answers:
                    out.extend(arrays)
                    cut += n_cut
                    bar.update(len(arrays))
            else:
                out, cut = self._pipelined(chunks, kind, w, bar)
        limit = self.query_max_length if kind == "queries" else self.doc_max_length
        warn_truncated(max(cut, shortened), len(texts), limit, kind)  # as the server counts (max)
        return out

    def _pipelined(self, chunks: list[list[str]], kind: str, w: float | None,
                   bar: Any) -> tuple[list[np.ndarray], int]:
        """Send ``chunks`` with up to ``in_flight`` requests open; answers in input order. The
        first failure is raised once the requests already sent have finished (none is left
        running behind the caller's back)."""
        from concurrent.futures import ThreadPoolExecutor

        out: list[np.ndarray] = []
        cut = 0
        with ThreadPoolExecutor(self.in_flight, thread_name_prefix="uibk-remote") as pool:
            pending = [pool.submit(self._post, c, kind, w) for c in chunks[:self.in_flight]]
            nxt = len(pending)
            try:
                while pending:
                    arrays, n_cut = pending.pop(0).result()
                    if nxt < len(chunks):
                        pending.append(pool.submit(self._post, chunks[nxt], kind, w))
                        nxt += 1
                    out.extend(arrays)
                    cut += n_cut
                    bar.update(len(arrays))
            finally:
                for f in pending:
                    f.cancel()
        return out, cut

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> RemoteEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["RemoteEncoder", "RemoteEncoderError", "ServerUnavailable", "pack_payload", "unpack_payload"]
