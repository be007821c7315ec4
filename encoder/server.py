"""``uibk-embed serve``: one shared encoder over HTTP for many processes (FastAPI + uvicorn).

Endpoints
---------
``GET /health``
    JSON: ``service`` ("uibk-embed"), ``model``, ``device``, ``format`` (beta, lambda_, projection),
    ``dense_weight``, ``dim``, length caps and the request ``limits``.
``GET /stats``
    JSON counters of the shared encoder: ``requests``, ``texts``, ``passes`` (forward passes),
    ``merged_passes`` (passes holding texts of several requests), ``multi_client_passes``
    (of several client processes), ``clients`` (distinct client ids seen), ``errors``.
``POST /encode``
    JSON request ``{"kind": "documents" | "queries", "texts": [...], "dense_weight": w | null}``;
    the answer is ``application/x-uibk-vectors``, the binary float32 payload of
    :func:`~uibk_embedding.encoder.remote.pack_payload`, with header ``X-UIBK-Truncated`` (texts
    cut at the length limit). Bad input answers 400 with a JSON ``detail``; a request over
    the limits answers 413.

Every request goes to one :class:`~uibk_embedding.encoder.shared.SharedEncoder`, whose worker
batches the texts of concurrent requests (from any number of client processes) together.

Command line::

    uibk-embed serve [--encoder PATH] [--host 127.0.0.1] [--port 8765] [--device cuda]
                     [--max-wait-ms 5] [--batch-tokens N] [--max-texts 1024]
                     [--max-text-chars 100000] [--max-body-mb 32] [--threads N]

Example
-------
>>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
>>> cfg = UIBKConfig.tiny()
>>> shared = SharedEncoder(UIBKEncoder.random(cfg, train_tokenizer(cfg, ["a wing"])))
>>> app = create_app(shared)
>>> sorted(r.path for r in app.routes if r.path in ("/health", "/stats", "/encode"))
['/encode', '/health', '/stats']
>>> shared.close()
"""

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from uibk_embedding.encoder.base import validate_texts
from uibk_embedding.encoder.remote import MEDIA_TYPE, pack_payload
from uibk_embedding.encoder.shared import SharedEncoder
from uibk_embedding.encoder.tagged import DIM

from uibk_embedding._optional import require

DEFAULT_PORT = 8765


class _Limits:
    def __init__(self, max_texts: int, max_text_chars: int, max_body_bytes: int) -> None:
        if min(max_texts, max_text_chars, max_body_bytes) < 1:
            raise ValueError("request limits must be positive")
        self.max_texts = int(max_texts)
        self.max_text_chars = int(max_text_chars)
        self.max_body_bytes = int(max_body_bytes)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def create_app(shared: SharedEncoder, *, max_texts: int = 1024, max_text_chars: int = 100_000,
               max_body_bytes: int = 32 * 2**20) -> Any:
    """The FastAPI application serving ``shared`` (see the module docstring for the endpoints)."""
    require("fastapi", "serve", "uibk-embed serve")
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    # (no "from __future__ import annotations" here: FastAPI reads the Request annotation)
    limits = _Limits(max_texts, max_text_chars, max_body_bytes)
    app = FastAPI(title="uibk-embed", description="tagged multi-vector encoder")
    clients: set[str] = set()
    enc = shared.encoder

    def error(status: int, detail: str) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=status)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "service": "uibk-embed",
            "status": "ok",
            "model": shared.model_name,
            "kind": enc.kind,
            "device": shared.device,
            "format": shared.format.to_stored(),
            "dense_weight": enc.dense_weight,
            "dim": DIM,
            "query_token_cap": enc.query_token_cap,
            "query_max_length": enc.query_max_length,
            "doc_max_length": enc.doc_max_length,
            "limits": limits.as_dict(),
        }

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        return {**shared.stats(), "clients": len(clients)}

    @app.post("/encode")
    async def encode(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return error(413, f"request body of {declared} bytes exceeds the limit of "
                              f"{limits.max_body_bytes} bytes; send fewer texts per request")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limits.max_body_bytes:
                return error(413, f"request body exceeds the limit of {limits.max_body_bytes} bytes; "
                                  "send fewer texts per request")
        try:
            req = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            return error(400, f"the request body is not JSON ({e})")
        if not isinstance(req, dict):
            return error(400, "the request body must be a JSON object with 'kind' and 'texts'")
        kind = req.get("kind")
        if kind not in ("documents", "queries"):
            return error(400, f"'kind' must be 'documents' or 'queries', got {kind!r}")
        texts = req.get("texts")
        if not isinstance(texts, list):
            return error(400, f"'texts' must be a list of strings, got {type(texts).__name__}")
        if len(texts) > limits.max_texts:
            return error(413, f"{len(texts)} texts in one request; this server accepts at most "
                              f"{limits.max_texts}")
        try:
            texts = validate_texts(texts)
        except (TypeError, ValueError) as e:
            return error(400, str(e))
        for i, t in enumerate(texts):
            if len(t) > limits.max_text_chars:
                return error(413, f"texts[{i}] has {len(t)} characters; this server accepts at most "
                                  f"{limits.max_text_chars} per text")
        w = req.get("dense_weight")
        if kind == "documents" and w is not None:
            return error(400, "'dense_weight' applies to queries only")
        if kind == "queries":
            try:
                w = enc.dense_weight if w is None else w
                enc._check_weight(w)
            except ValueError as e:
                return error(400, str(e))
        client = request.headers.get("x-uibk-client", "")
        if client:
            clients.add(client)
        try:
            fut = shared.submit(texts, is_query=kind == "queries", dense_weight=float(w or 1.0),
                                client=client)
            res = await asyncio.wrap_future(fut)
        except Exception as e:  # the model failed: the client must know, nothing half-done
            return error(500, f"encoding failed: {type(e).__name__}: {e}")
        return Response(pack_payload(res), media_type=MEDIA_TYPE,
                        headers={"X-UIBK-Truncated": str(res.truncated)})

    return app


@contextlib.contextmanager
def serve_subprocess(*args: str, startup_timeout: float = 300.0) -> Iterator[str]:
    """Run ``uibk-embed serve ARGS`` in a child process on a free local port; yield its URL once
    ``/health`` answers, stop the child (terminate, then kill) on exit. A child that exits or
    stays unhealthy past ``startup_timeout`` seconds raises ``RuntimeError`` with its output.

    >>> with serve_subprocess("--device", "cpu") as url:  # doctest: +SKIP
    ...     RemoteEncoder(url).encode_documents(["a wing"])[0].shape[1]
    128
    """
    import socket
    import subprocess
    import tempfile
    import time

    httpx = require("httpx", "serve", "serve_subprocess")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uibk_embedding.cli", "serve", "--port", str(port),
                                 *args], stdout=log, stderr=subprocess.STDOUT, text=True)
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="uibk-embed serve",
                                description="serve one shared encoder over HTTP")
    p.add_argument("--encoder", default=None,
                   help="encoder folder (default: the embedded all-MiniLM-L6-v2 model)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let a PyLate model folder run the Python code it ships (read it first)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: CUDA when present)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long to wait for more requests to batch together")
    p.add_argument("--batch-tokens", type=int, default=None, help="padded tokens per forward pass")
    p.add_argument("--max-texts", type=int, default=1024, help="texts per request at most")
    p.add_argument("--max-text-chars", type=int, default=100_000, help="characters per text at most")
    p.add_argument("--max-body-mb", type=float, default=32.0, help="request body size limit")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``uibk-embed serve``: load the encoder, print the address, serve until interrupted.

    >>> main(["--help"])  # doctest: +SKIP
    """
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    uvicorn = require("uvicorn", "serve", "uibk-embed serve")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    shared = SharedEncoder(args.encoder, device=args.device, batch_tokens=args.batch_tokens,
                           max_wait_ms=args.max_wait_ms, show_progress=False,
                           **({"trust_remote_code": True} if args.trust_remote_code else {}))
    app = create_app(shared, max_texts=args.max_texts, max_text_chars=args.max_text_chars,
                     max_body_bytes=int(args.max_body_mb * 2**20))
    print(f"uibk-embed serve: {shared.model_name} on {shared.device}, "
          f"listening on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        shared.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
