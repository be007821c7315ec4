"""A client of ``uibk-embed serve``: :class:`RemoteEncoder`, the encoder protocol over HTTP.

Many processes (indexing jobs, services) can share one GPU through one server: each holds a
``RemoteEncoder``; the server's :class:`~uibk_embedding.encoder.shared.SharedEncoder` batches
their requests together. The vectors travel as one binary float32 payload per request (the
format of :func:`pack_payload`), never as JSON lists of floats; they are the same bytes the
server's encoder produced.

Errors say what happened: :class:`ServerUnavailable` (nothing listening, timeout),
:class:`RemoteEncoderError` (the answer is not a valid payload, the server failed, or it now
serves another format than the one the client read at its start), and ``ValueError`` /
``TypeError`` for bad input, as in-process.

Every ``/encode`` answer of the server names its format (:func:`format_id`, header
``X-UIBK-Format``) and its default dense weight (``X-UIBK-Dense-Weight``): a server restarted
with another model is an error, never vectors of two models mixed in one store. An answer
without them (a server older than these headers) is accepted, as before.

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
FORMAT_HEADER = "X-UIBK-Format"
DENSE_WEIGHT_HEADER = "X-UIBK-Dense-Weight"
_HEAD = struct.Struct("<8sII")  # magic, number of lists, dimension


class RemoteEncoderError(UIBKError, RuntimeError):
    """The server answered, but not with what the protocol promises."""


class ServerUnavailable(RemoteEncoderError, BackendUnavailable):
    """No uibk-embed server answered at the URL (refused, unreachable or timed out)."""


def format_id(fmt: TaggedFormat) -> str:
    """The format as one header value (``X-UIBK-Format``): its constants and projection, all that
    decides whether two lists can share a store.

    >>> format_id(TaggedFormat(projection="random-1a2b"))
    'beta=0.9; lambda_=0.75; projection=random-1a2b'
    """
    return f"beta={fmt.beta!r}; lambda_={fmt.lambda_!r}; projection={fmt.projection}"


def check_api_key(key: str, what: str = "the API key") -> str:
    """``key`` when an HTTP header can carry it (``Authorization: Bearer KEY``): printable ASCII.
    Any other character is refused here, by position (the key itself is never repeated), not by
    the HTTP library later (a bare ``UnicodeEncodeError``) or never (a server's key no client
    could send).

    >>> check_api_key("k3y-0123456789abcdef")
    'k3y-0123456789abcdef'
    >>> check_api_key("clé-0123456789abcdef")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the API key holds a character that is not printable ASCII (at position 2): ...
    """
    for i, c in enumerate(key):
        if not (c.isascii() and c.isprintable()):
            raise ValueError(f"{what} holds a character that is not printable ASCII (at position {i}): an "
                             "HTTP header cannot carry it")
    return key


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
        A request also stays under the server's body limit (``limits.max_body_bytes`` of
        ``/health``): texts are sent as UTF-8, and a list is split where its body would pass
        the limit. A single text over the limit even after the server's character cut
        (``max_text_chars``) is cut to fit, and counted and warned about as any over-long text.
    in_flight: requests one call keeps open at a time (default 2): a long list is sent as several
        requests, and while the server encodes one, the next is already on its way, so the
        server's worker does not idle during a round trip. Results keep the input order.
    api_key: sent as ``Authorization: Bearer KEY`` (default ``$UIBK_API_KEY``), for a server
        started with an API key; printable ASCII (``ValueError`` otherwise). A busy server's 429
        is retried after its ``Retry-After`` (``retries_429`` times at most).

    On construction the client reads ``/health`` (format, dense weight, limits); a server that is
    down raises :class:`ServerUnavailable` there, with the command to start one. A server that
    asks for a key is asked once (``/stats``) there too: no key, or a key it refuses (HTTP 401 or
    403), raises :class:`RemoteEncoderError` saying which. Each answer is
    checked against that format and dense weight: one of another (a server restarted with
    another model) raises :class:`RemoteEncoderError` naming both.

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
        # where the key sent came from, for the message when the server refuses it ("" if none)
        self._key_from = "" if not key else "api_key=" if api_key is not None else "$UIBK_API_KEY"
        if key:  # stripped: a key read from a file ends in a newline, which no header can carry
            what = "the API key" if api_key is not None else "the API key in $UIBK_API_KEY"
            headers["Authorization"] = f"Bearer {check_api_key(key, what)}"
        self.retries_429 = int(retries_429)
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout, connect=connect_timeout), headers=headers)
        info = self.health()
        if info.get("auth") is True:  # a missing or refused key said now, before any work is done
            self._request("GET", "/stats")
        try:
            self.format = TaggedFormat.from_dict(info["format"])
            self.dense_weight = float(info["dense_weight"])
            self.model_name = str(info["model"])
            self.max_texts = int(info["limits"]["max_texts"])
            self.request_texts = min(self.max_texts, int(request_texts or 256))
            self.max_text_chars = int(info["limits"]["max_text_chars"])
            body = info["limits"].get("max_body_bytes")  # absent from older servers: not split by size
            self.max_body_bytes = None if body is None else int(body)
            self._format_id = format_id(self.format)
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
                if r.status_code in (401, 403) and self._key_from:
                    raise RemoteEncoderError(
                        f"the uibk-embed server at {self.url} refused the API key (HTTP {r.status_code}; "
                        f"the key of {self._key_from}): check it against the key the server was "
                        "started with (`uibk-embed serve --api-key-file`)")
                if r.status_code in (401, 403):
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
        body = json.dumps({"kind": kind, "texts": texts, "dense_weight": w}, ensure_ascii=False).encode()
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
        self._check_same_model(r.headers)
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

    def _check_same_model(self, headers: Any) -> None:
        """The answer's format and default dense weight must be those read from ``/health`` at
        construction; an answer without them (an older server) is taken, as before."""
        theirs = headers.get(FORMAT_HEADER)
        if theirs is not None and theirs != self._format_id:
            raise RemoteEncoderError(
                f"the uibk-embed server at {self.url} now answers with format {theirs}, not "
                f"{self._format_id} as when this RemoteEncoder was made (was it restarted with another "
                "model?): the lists of two formats do not mix in one store. Make a new RemoteEncoder "
                "for the new model")
        weight = headers.get(DENSE_WEIGHT_HEADER)
        if weight is None:
            return
        try:
            same = float(weight) == self.dense_weight
        except ValueError:
            raise RemoteEncoderError(f"the server at {self.url} answered a malformed {DENSE_WEIGHT_HEADER} "
                                     f"header: {weight[:40]!r}") from None
        if not same:
            raise RemoteEncoderError(
                f"the uibk-embed server at {self.url} now has the default dense weight {weight}, not "
                f"{self.dense_weight!r} as when this RemoteEncoder was made (was it restarted with another "
                "model?): make a new RemoteEncoder for the new model")

    def _requests(self, texts: list[str], kind: str, w: float | None) -> tuple[list[list[str]], set[int]]:
        """``texts`` as the lists of the requests to send: ``request_texts`` texts at most, and a
        body (UTF-8 JSON) within the server's ``max_body_bytes``; and the positions of the
        requests whose one text was cut to fit that limit (the server does not know it was)."""
        step, limit = self.request_texts, self.max_body_bytes
        if limit is None:
            return [texts[i:i + step] for i in range(0, len(texts), step)], set()
        head = len(json.dumps({"kind": kind, "texts": [], "dense_weight": w}).encode())
        size = lambda t: len(json.dumps(t, ensure_ascii=False).encode())  # noqa: E731
        chunks: list[list[str]] = []
        forced: set[int] = set()
        body = 0  # the body size of chunks[-1]
        for i, text in enumerate(texts):
            n = size(text)
            joins = chunks and len(chunks) - 1 not in forced and len(chunks[-1]) < step
            if joins and body + 2 + n <= limit:  # ", " between two texts
                chunks[-1].append(text)
                body += 2 + n
                continue
            if head + n > limit:  # alone past the limit: cut to fit (alone), as an over-long text is
                text = self._cut_to_fit(text, limit - head, size, i)
                forced.add(len(chunks))
            chunks.append([text])
            body = head + size(text)
        return chunks, forced

    def _cut_to_fit(self, text: str, room: int, size: Any, i: int) -> str:
        """The longest :func:`cut_text` of ``text`` whose JSON string takes ``room`` bytes at most."""
        lo, hi = 0, len(text.lstrip())  # characters after the leading whitespace
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if size(cut_text(text, mid)) <= room else (lo, mid - 1)
        if lo == 0:
            raise ValueError(f"texts[{i}] cannot be sent: the uibk-embed server at {self.url} takes request "
                             f"bodies of at most {self.max_body_bytes} bytes, too few for any of this text "
                             "(its leading whitespace alone is larger)")
        return cut_text(text, lo)

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
        # an over-long text is not refused: cut here (a smaller body) one character past where
        # the server cuts, so that the server cuts it too and counts it once, with the texts it
        # truncates at the token limit (as in-process, a warning)
        texts = [cut_text(t, self.max_text_chars + 1) for t in texts]
        from tqdm.auto import tqdm

        progress = self.show_progress if show_progress is None else show_progress
        disable = {True: False, False: True}.get(progress, None if len(texts) >= 256 else True)
        chunks, forced = self._requests(texts, kind, w)
        out: list[np.ndarray] = []
        cut = 0
        with tqdm(total=len(texts), desc=f"encoding {kind}", unit="text", disable=disable) as bar:
            if len(chunks) == 1 or self.in_flight == 1:
                answers: Iterable[tuple[list[np.ndarray], int]] = (self._post(c, kind, w) for c in chunks)
            else:
                answers = self._pipelined(chunks, kind, w)
            for k, (arrays, n_cut) in enumerate(answers):
                out.extend(arrays)
                cut += max(n_cut, k in forced)  # a text the client cut to fit the body: cut once
                bar.update(len(arrays))
        limit = self.query_max_length if kind == "queries" else self.doc_max_length
        warn_truncated(cut, len(texts), limit, kind)
        return out

    def _pipelined(self, chunks: list[list[str]], kind: str,
                   w: float | None) -> Iterator[tuple[list[np.ndarray], int]]:
        """Send ``chunks`` with up to ``in_flight`` requests open; answers in input order. The
        first failure is raised once the requests already sent have finished (none is left
        running behind the caller's back)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.in_flight, thread_name_prefix="uibk-remote") as pool:
            pending = [pool.submit(self._post, c, kind, w) for c in chunks[:self.in_flight]]
            nxt = len(pending)
            try:
                while pending:
                    answer = pending.pop(0).result()
                    if nxt < len(chunks):
                        pending.append(pool.submit(self._post, chunks[nxt], kind, w))
                        nxt += 1
                    yield answer
            finally:
                for f in pending:
                    f.cancel()

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> RemoteEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["RemoteEncoder", "RemoteEncoderError", "ServerUnavailable", "format_id", "pack_payload",
           "unpack_payload"]
