"""The ``uibk-embed`` command line.

Subcommands::

    uibk-embed quickstart                      index a small built-in corpus, answer a query
    uibk-embed index DATA --backend B --path P  BEIR folder or JSONL file -> a store
    uibk-embed index DATA --backend milvus --option uri=... --ray [--ray-address A] [--workers N]
    uibk-embed search "query" --backend B --path P [-k 10] [--filter JSON] [--retrieval-mode M] [--json]
    uibk-embed eval DATA [--backend B] [--dense-weight W] [--retrieval-mode M] [--json]   in a temporary store
    uibk-embed eval DATA --path P [--create]    an existing store, read as it is (--create: build it)
    uibk-embed fit-projection DATA --out FOLDER  P by PCA on a corpus -> an encoder folder
    uibk-embed export-pylate OUT [--encoder E]  the encoder as a PyLate model folder (custom modules)
    uibk-embed export-st OUT [--encoder E | --dense D --tokens T]  ... as a sentence-transformers 6 folder
    uibk-embed serve ...                        the shared encoder over HTTP
    uibk-embed compare DATA --backends ...      compare backends (benchmarks)

Backend options go through ``--option KEY=VALUE`` (repeatable; VALUE is read as JSON when it
parses, else as a string), e.g. ``--option collection=docs --option url=http://...``.

Only ``index`` (and ``eval --create``) write into a store. ``search`` and ``eval`` read one as it
is and never create one: a missing store is one line, ``uibk-embed: no store at PATH (...)``,
and exit status 2, with nothing created.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding import __version__, adapters
from uibk_embedding.adapters.exact import PROFILES
from uibk_embedding.adapters.filters import parse_filter
from uibk_embedding.adapters.indexing import upsert_batches
from uibk_embedding.adapters.registry import (
    BACKENDS,
    READ_ONLY_BACKENDS,
    detect_backend,
    find_backend,
    require_store,
    takes_option,
)
from uibk_embedding.apps.data import kept_metadata, load_beir, read_corpus
from uibk_embedding.apps.distributed import index_distributed
from uibk_embedding.apps.evaluation import (
    encode_collection,
    encode_queries_for_store,
    index_into,
    run_eval,
    with_dense_weight,
)
from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.onnx_backend import BACKENDS as ENCODER_BACKENDS
from uibk_embedding.encoder.projection import projection_id
from uibk_embedding.encoder.pylate_model import save_sentence_transformers
from uibk_embedding.encoder.remote import RemoteEncoder
from uibk_embedding.errors import DataError, StoreNotFound, UIBKError
from uibk_embedding.metrics import evaluate
from uibk_embedding.tagged import MAX_POOL_FACTOR, POOL_METHODS, RETRIEVAL_MODES, query_for_mode
from uibk_embedding.token_pooling import check_pool_factor, same_pooling_but_ids

QUICKSTART_CORPUS = [
    ("wing-slipstream", "Experimental investigation of the lift on a wing in a propeller slipstream."),
    ("boundary-layer", "Transition from laminar to turbulent flow in the boundary layer of a flat plate."),
    ("heat-transfer", "Heat transfer to a blunt body in hypersonic flow at high Mach number."),
    ("panel-flutter", "Flutter of thin panels in supersonic flow and its suppression by damping."),
    ("shock-waves", "Interaction of an oblique shock wave with a laminar boundary layer."),
    ("microwave-dielectric", "Measuring the dielectric constant of liquids with microwave cavities."),
    ("transistor-amplifier", "Design of a low noise transistor amplifier for radio receivers."),
    ("digital-filter", "Digital computers in the design of band pass filters."),
    ("ferrite-memory", "Ferrite core memories with fast random access for digital computers."),
    ("solar-cells", "Silicon solar cells: efficiency under concentrated sunlight."),
    ("recipe-bread", "A sourdough bread recipe with a long cold fermentation."),
    ("tennis", "The serve and volley style in modern tennis."),
]
QUICKSTART_QUERY = "how does a propeller slipstream change the lift of a wing?"


def _parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in pairs or ():
        if "=" not in p:
            raise SystemExit(f"--option expects KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _store_options(args: argparse.Namespace) -> dict[str, Any]:
    opts = _parse_options(args.option)
    if getattr(args, "path", None):
        opts.setdefault("path", args.path)
    return opts


# the option that says where each backend keeps what it indexes; without one of them the store
# lives in memory or a temporary folder and is gone when `uibk-embed index` returns
_PLACE = {"exact": ("path",), "plaid": ("path",), "warp": ("path",), "qdrant-edge": ("path",),
          "milvus-lite": ("path",), "qdrant": ("path", "url", "host", "client"), "lancedb": ("path", "uri")}


def _has_a_place(backend: str, opts: dict[str, Any]) -> bool:
    """Whether ``opts`` say where the store lives (else: memory or a temporary folder); backends
    that always need a server count as placed."""
    names = _PLACE.get(backend)
    return names is None or any(opts.get(n) for n in names) or opts.get("location") not in (None, ":memory:")


def _require_a_place(backend: str, opts: dict[str, Any]) -> None:
    """`index` into a store that would vanish with the process: refused before anything is read."""
    if _has_a_place(backend, opts):
        return
    names = _PLACE[backend]
    hint = ("--path DIR" if names == ("path",) else "--path DIR (local mode) or --option url=URL (a server)"
            if "url" in names else "--path DIR or --option uri=URI")
    raise SystemExit(f"uibk-embed index: the {backend} backend without {hint} would index into memory "
                     "and throw it all away when the command ends; say where the store lives")


def _dense_weight(text: str) -> float:
    try:
        w = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (w > 0 and w != float("inf")):
        raise argparse.ArgumentTypeError(f"the dense weight must be a positive number, got {text}")
    return w


def _positive_int(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if k <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {k}")
    return k


def _load_encoder(args: argparse.Namespace, **kw: Any):
    dense, tokens = getattr(args, "dense", None), getattr(args, "tokens", None)
    if getattr(args, "projection", None):
        if dense or tokens:
            raise SystemExit("uibk-embed: --projection chooses the embedded model's projections; "
                             "it does not apply to --dense/--tokens")
        kw.setdefault("projection", args.projection)
    if getattr(args, "trust_remote_code", False):
        kw.setdefault("trust_remote_code", True)
    kw.update(_encoder_choice(args))
    try:
        return load_encoder(args.encoder, dense=dense, tokens=tokens, **kw)
    except ValueError as e:  # e.g. only one of --dense/--tokens, a folder of the wrong kind
        raise SystemExit(f"uibk-embed: {e}") from None


def _encoder_choice(args: argparse.Namespace) -> dict[str, Any]:
    """``--encoder-backend`` and ``--revision`` as ``load_encoder`` options (none given: none).

    >>> _encoder_choice(argparse.Namespace(encoder_backend="onnx", revision=None))
    {'backend': 'onnx'}
    """
    out: dict[str, Any] = {}
    if getattr(args, "encoder_backend", None):
        out["backend"] = args.encoder_backend
    if getattr(args, "revision", None):
        out["revision"] = args.revision
    return out


def _print_hits(hits: list, out=None) -> None:
    out = out or sys.stdout
    print(f"{'rank':>4}  {'score':>8}  {'relevance':>9}  {'token':>7}  {'dense':>7}  {'sep':>3}  id",
          file=out)
    for r, h in enumerate(hits, 1):
        d = h.decomposition
        tok = f"{d.token_part:7.3f}" if d else "    n/a"
        den = f"{d.dense_part:7.3f}" if d else "    n/a"
        sep = ("yes" if d.separated and d.slots_aligned else "no") if d else "n/a"
        text = str(h.metadata.get("text", ""))[:60]
        rel = "      n/a" if h.relevance is None else f"{h.relevance:9.3f}"
        print(f"{r:>4}  {h.score:8.3f}  {rel}  {tok}  {den}  {sep:>3}  {h.id}  {text}", file=out)
    if hits and hits[0].decomposition:
        d = hits[0].decomposition
        print(f"\nscore = constant {d.constant:.3f} + token part {d.token_part:.3f} "
              f"(beta x token MaxSim {d.token:.3f}) + dense part {d.dense_part:.3f} "
              f"(beta x lambda x w x dense cosine {d.dense:.3f}, w = {d.dense_weight:g})", file=out)


class Progress:
    """Periodic progress lines on stderr when it is not a terminal (logs, CI, ``nohup``), where
    no progress bar shows: ``wrap(encode)`` counts the texts encoded and prints a line at most
    every ``every_s`` seconds, and one at the end. On a terminal (or ``enabled=False``) silent.

    >>> import io
    >>> out = io.StringIO()
    >>> p = Progress("indexing", 4, every_s=0, out=out, enabled=True)
    >>> encode = p.wrap(lambda texts: [len(t) for t in texts])
    >>> encode(["a", "bb"])
    [1, 2]
    >>> print(out.getvalue().strip())  # doctest: +ELLIPSIS
    uibk-embed: indexing: 2 of 4 (50%), ... s
    """

    def __init__(self, label: str, total: int, *, every_s: float = 30.0, out: Any = None,
                 enabled: bool | None = None) -> None:
        self.label, self.total, self.every_s = label, int(total), float(every_s)
        self.out = out if out is not None else sys.stderr
        isatty = getattr(self.out, "isatty", None)
        self.enabled = (not (isatty and isatty())) if enabled is None else enabled
        self.done = 0
        self.t0 = self.last = time.monotonic()

    def update(self, n: int) -> None:
        """Count ``n`` more texts; print a line if ``every_s`` passed since the last one."""
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self.last >= self.every_s or self.done >= self.total):
            self.last = now
            pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            print(f"uibk-embed: {self.label}: {self.done} of {self.total}{pct}, {now - self.t0:.0f} s",
                  file=self.out, flush=True)

    def wrap(self, encode: Any) -> Any:
        """``encode`` counting its texts (called once per batch)."""
        def counted(texts: Sequence[str], *args: Any, **kwargs: Any) -> Any:
            out = encode(texts, *args, **kwargs)
            self.update(len(texts))
            return out
        return counted


_TRUNCATED = re.compile(r"^(\d+) of (\d+) (\w+) were longer than (\d+) tokens")


def _issued_here(frame: Any) -> bool:
    """Whether the code that called ``warnings.warn`` is this library's: the first frame, from
    ``frame`` outwards, outside the ``warnings`` module (read inside a ``showwarning`` hook)."""
    while frame is not None and frame.f_globals.get("__name__") == "warnings":
        frame = frame.f_back
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "uibk_embedding" or name.startswith("uibk_embedding.")


def _say(message: Warning | str, category: type[Warning], filename: str, lineno: int, ours: bool,
         show: Any, out: Any = None) -> None:
    """This library's ``UserWarning``: one ``uibk-embed: ...`` line on ``out`` (stderr); any other
    warning as ``show`` (Python's ``showwarning``) shows it, with its place and source line."""
    if ours and issubclass(category, UserWarning):
        print(_one_line(str(message)), file=out if out is not None else sys.stderr)
    else:
        show(message, category, filename, lineno)


@contextlib.contextmanager
def warnings_said_as_lines(out: Any = None) -> Iterator[None]:
    """Show this library's ``UserWarning`` (a corpus row skipped, queries the qrels judge that
    the folder lacks...) as one ``uibk-embed: ...`` line on stderr, as the CLI says everything
    else, not as a Python warning with a source line. Warnings of other libraries, and the
    library's other categories (``DeprecationWarning``, ``RuntimeWarning``), are shown by Python
    as before, under Python's filters.

    >>> import io, warnings
    >>> out = io.StringIO()
    >>> with warnings_said_as_lines(out):  # this docstring's code runs as the library's
    ...     warnings.warn("corpus.jsonl: skipped 1 documents with no text")
    >>> print(out.getvalue().strip())
    uibk-embed: corpus.jsonl: skipped 1 documents with no text
    """
    with warnings.catch_warnings():
        show = warnings.showwarning

        def hook(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
            _say(message, category, filename, lineno, _issued_here(sys._getframe(1)), show,
                 out if out is not None else sys.stderr)

        hook.passthrough = show  # type: ignore[attr-defined]  # for truncation_said_once's replay
        warnings.showwarning = hook
        yield


@contextlib.contextmanager
def truncation_said_once(out: Any = None, *, encoded: dict[str, int] | None = None) -> Iterator[None]:
    """Collect the encoders' truncation warnings (one per batch that cut a text, each with a
    source line) and say them once at the end, with the count, on stderr. ``encoded``: how many
    texts of each kind (``"documents"``, ``"queries"``) the run encodes, the count's total (the
    warnings' own totals count only the batches that cut something); a kind without one is said
    without a total. This library's other ``UserWarning`` are said as one line each
    (:func:`warnings_said_as_lines`); other warnings pass through unchanged.

    >>> import io, warnings
    >>> out = io.StringIO()
    >>> with truncation_said_once(out, encoded={"documents": 50}):
    ...     for _ in range(3):
    ...         warnings.warn("2 of 10 documents were longer than 512 tokens and were truncated")
    >>> print(out.getvalue().strip())
    uibk-embed: 6 of 50 documents were longer than 512 tokens and were truncated to them
    """
    out = out if out is not None else sys.stderr
    outer = warnings.showwarning
    show = getattr(outer, "passthrough", outer)  # not re-read by warnings_said_as_lines' hook
    caught: list[tuple[Any, type[Warning], str, int, bool]] = []

    def record(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: Any = None, line: str | None = None) -> None:
        caught.append((message, category, filename, lineno, _issued_here(sys._getframe(1))))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            yield
    finally:
        # after the recording: showing a warning while it records appended it to ``caught``
        # again, so the loop never ended (and filled the memory)
        cut: dict[tuple[str, str], int] = {}
        others: dict[tuple, tuple[Any, type[Warning], str, int, bool]] = {}
        for w in caught:
            m = _TRUNCATED.match(str(w[0]))
            if m is None:  # each other warning once per place, as Python's default filter shows it
                others.setdefault((w[1], str(w[0]), w[2], w[3]), w)
                continue
            key = (m.group(3), m.group(4))
            cut[key] = cut.get(key, 0) + int(m.group(1))  # only the cut ones add up
        for message, category, filename, lineno, ours in others.values():
            _say(message, category, filename, lineno, ours, show, out)
        for (what, limit), n in cut.items():
            total = (encoded or {}).get(what)
            of = f"{n} of {total} {what}" if total is not None else f"{n} {what}"
            print(f"uibk-embed: {of} were longer than {limit} tokens and were truncated to them", file=out)


# -- subcommands ---------------------------------------------------------------------------
def _check_encoder_url(args: argparse.Namespace) -> None:
    """``--encoder-url``: a server encodes with its own model, so no local encoder option applies."""
    if args.encoder_url and (args.dense or args.tokens):
        raise SystemExit("uibk-embed: with --encoder-url the servers encode: save the composed "
                         "encoder (load_encoder(dense=..., tokens=...).save(DIR)) and run "
                         "`uibk-embed serve --encoder DIR`")
    given = [f for f in ("encoder", "projection", "trust_remote_code", "encoder_backend", "revision")
             if getattr(args, f, None)]
    if args.encoder_url and given:
        raise SystemExit(f"uibk-embed: with --encoder-url the servers encode with their own model: "
                         f"--{given[0].replace('_', '-')} does not apply (give it to `uibk-embed serve`)")


def _refuse_a_file_as_the_store(backend: str, opts: dict[str, Any]) -> None:
    """``index DATA --path FILE``: a store folder cannot be made where a file is (it said
    ``[Errno 17] File exists``); milvus-lite's database is a file, so it is left to the backend."""
    path = opts.get("path")
    if path is not None and backend != "milvus-lite" and Path(path).is_file():
        raise UsageError(f"uibk-embed index: --path {path} is a file, not a store folder: --path names the "
                         "folder the store is written to, the data to index is the first argument "
                         f"(`uibk-embed index {path} --path ./my-index`)")


def _new_store_folder(backend: str, opts: dict[str, Any]) -> Path | None:
    """The folder (or milvus-lite file) ``index`` is about to create: ``--path`` when nothing is there."""
    path = opts.get("path")
    if path is None or "path" not in _PLACE.get(backend, ()) or os.path.lexists(path):
        return None
    return Path(path)


def _remove_if_nothing_stored(store: Any, made: Path | None) -> None:
    """After a failed ``index``: close ``store``; remove the folder this run made if it holds no
    document (a server down, a key refused), so no empty store is left behind to be mistaken for
    one. A store with documents is kept (``index`` again to finish it)."""
    empty = store is None
    if store is not None:
        with contextlib.suppress(Exception):
            empty = store.count() == 0
        with contextlib.suppress(Exception):
            store.close()
    if made is not None and empty:
        with contextlib.suppress(OSError):
            shutil.rmtree(made) if made.is_dir() and not made.is_symlink() else made.unlink()


def cmd_index(args: argparse.Namespace) -> int:
    _check_encoder_url(args)
    if len(args.encoder_url) > 1 and not args.ray:
        raise SystemExit("uibk-embed: one process encodes through one server: several --encoder-url "
                         "need --ray (the actors share them)")
    for flag in ("save_encoder", "fit_sample"):
        if getattr(args, flag) is not None and not args.fit_projection:
            raise SystemExit(f"uibk-embed: --{flag.replace('_', '-')} needs --fit-projection")
    if args.profile is not None and args.backend != "exact" and (
            args.ray or not takes_option(args.backend, "profile")):
        where = "--ray" if args.ray else f"the {args.backend} backend"  # Ray's actors take no profile
        raise UsageError(f"uibk-embed: --profile chooses what a store keeps; {where} takes none "
                         "(docs/compact.md says which backends do)")
    if args.ray:
        if args.fit_projection:
            raise SystemExit("uibk-embed: --fit-projection runs in one process: fit first "
                             "(`uibk-embed fit-projection DATA --out DIR`), then `index --ray --encoder DIR`")
        return _index_ray(args)
    for flag in ("ray_address", "workers", "resume", "skip_bad", "num_gpus"):
        if getattr(args, flag):
            raise SystemExit(f"uibk-embed: --{flag.replace('_', '-')} needs --ray")
    opts = _store_options(args)
    if args.profile is not None:
        opts["profile"] = args.profile
    _require_a_place(args.backend, opts)
    _refuse_a_file_as_the_store(args.backend, opts)
    docs = read_corpus(args.data)
    kept = kept_metadata(docs)  # a line's other fields are metadata: said, never dropped unsaid
    if kept:
        print(f"uibk-embed: {kept}", file=sys.stderr)
    if args.encoder_url:
        if args.fit_projection:
            raise SystemExit("uibk-embed: --fit-projection fits an in-process encoder; a server "
                             "encodes with its own (fit-projection, then serve that folder)")

        enc = RemoteEncoder(args.encoder_url[0])
        _pool_factor_of_the_server(args, enc)
    else:
        if not args.fit_projection:
            _adopt_the_stores_encoder(args, opts)
        enc = _load_encoder(args, **_pool_option(args))
    saved_to = _fit_on_the_corpus(args, enc, docs, opts) if args.fit_projection else None
    if hasattr(enc, "fit_pooling") and enc.format.pool_factor > 1 and enc.format.pool_method == "content":
        enc.fit_pooling([d.full_text for d in docs], show_progress=False if args.quiet else None)
    made, store = _new_store_folder(args.backend, opts), None
    try:
        store = adapters.open_store(args.backend, format=enc.format, **opts)  # records the fitted projection
        if hasattr(enc, "adopt_pooling") and same_pooling_but_ids(store.format, enc.format):
            enc.adopt_pooling(store.format)  # a store keeps the frequent ids of its first corpus
        check_pool_factor(store.format, enc.format, f"the {args.backend} store")  # before any encoding
        if saved_to is not None:
            enc.save_projections(saved_to)  # after the store exists: a store folder holds it
        t0 = time.perf_counter()
        lines = Progress(f"indexing into {args.backend}", len(docs), enabled=False if args.quiet else None)
        with truncation_said_once(encoded={"documents": len(docs)}):
            upsert_batches(store, [d.id for d in docs], [d.stored_metadata(args.store_text) for d in docs],
                           texts=[d.full_text for d in docs],
                           encode=lines.wrap(lambda texts: enc.encode_documents(texts, show_progress=False)),
                           batch_size=args.batch_size, progress=False if args.quiet else None,
                           desc=f"indexing into {args.backend}")
        n = store.count()
    except BaseException:
        _remove_if_nothing_stored(store, made)
        raise
    store.close()
    print(f"indexed {len(docs)} documents into {args.backend} ({n} stored) "
          f"in {time.perf_counter() - t0:.1f} s")
    if saved_to is not None:
        inside = _beside_store(args.backend, opts) == saved_to
        found = ", or just `--path`: it is found there" if inside else ""
        print(f"the fitted encoder is in {saved_to}: search with it (`--encoder {saved_to}`{found})")
    return 0


def _pool_option(args: argparse.Namespace) -> dict[str, Any]:
    """``index --pool-factor N [--pool-method M]``: the encoder's ``pool_factor=`` and
    ``pool_method=`` (token pooling of the documents, docs/format.md#pooling); none given: the
    encoder's own (1, off, unless its folder says)."""
    out: dict[str, Any] = {} if args.pool_factor is None else {"pool_factor": args.pool_factor}
    if getattr(args, "pool_method", None) is not None:
        out["pool_method"] = args.pool_method
    return out


def _pool_factor_of_the_server(args: argparse.Namespace, enc: Any) -> None:
    """A server pools (or not) as it was started: ``--pool-factor`` can only agree with it."""
    served = getattr(enc.format, "pool_factor", 1)
    if args.pool_factor is not None and args.pool_factor != served:
        raise SystemExit(f"uibk-embed: the server at {enc.url} encodes documents with pool_factor={served}, "
                         f"not --pool-factor {args.pool_factor}: a server pools as its encoder was made")
    method = getattr(enc.format, "pool_method", "content")
    if getattr(args, "pool_method", None) is not None and args.pool_method != method:
        raise SystemExit(f"uibk-embed: the server at {enc.url} pools documents with pool_method={method!r}, "
                         f"not --pool-method {args.pool_method}: a server pools as its encoder was made")


def _pool_factor_arg(text: str) -> int:
    k = _positive_int(text)
    if k > MAX_POOL_FACTOR:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_POOL_FACTOR}, got {k}")
    return k


# backends whose store folder is ours, so a fitted encoder can live inside it (found by `search`)
_OWN_FOLDERS = ("exact", "plaid", "warp")
FITTED_ENCODER_DIR = "uibk-encoder"
FIT_SAMPLE = 5000  # documents `index --fit-projection` reads at most (--fit-sample)


def _beside_store(backend: str, opts: dict[str, Any]) -> Path | None:
    path = opts.get("path")
    return Path(path) / FITTED_ENCODER_DIR if backend in _OWN_FOLDERS and path else None


def _adopt_the_stores_encoder(args: argparse.Namespace, opts: dict[str, Any]) -> None:
    """The encoder ``index --fit-projection`` saved inside the store is the one its queries and
    new documents need: used by ``search``, ``eval`` and ``index`` unless an encoder is given."""
    fitted = _beside_store(args.backend, opts)
    if fitted is not None and fitted.is_dir() and not (args.encoder or args.dense or args.projection):
        args.encoder = str(fitted)


def _fit_on_the_corpus(args: argparse.Namespace, enc: Any, docs: list, opts: dict[str, Any]) -> Path:
    """``index --fit-projection``: PCA ``P`` fitted on (a sample of) the documents being indexed,
    the encoder's folder returned (saved by the caller once the store exists), so the store records
    the fitted projection and every later query can use it."""
    if not hasattr(enc, "fit_projection") or not hasattr(enc, "save_projections"):
        raise SystemExit(f"uibk-embed: --fit-projection needs an encoder with its own projections; "
                         f"{type(enc).__name__} has none")
    out = Path(args.save_encoder) if args.save_encoder else _beside_store(args.backend, opts)
    if out is None:
        raise SystemExit(f"uibk-embed: --fit-projection with the {args.backend} backend needs "
                         "--save-encoder DIR: the fitted encoder must be kept to search the store")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"uibk-embed: {out} is not empty: the fitted encoder needs a new folder "
                         "(or search with the encoder already there: `--encoder " + str(out) + "`)")
    rng = np.random.default_rng(0)
    sample = args.fit_sample or FIT_SAMPLE
    pick = sorted(rng.choice(len(docs), size=min(len(docs), sample), replace=False).tolist())
    t0 = time.perf_counter()
    try:
        enc.fit_projection([docs[i].full_text for i in pick])
    except ValueError as e:
        raise SystemExit(f"uibk-embed: cannot fit a projection on this corpus: {e}") from None
    print(f"fitted P on {len(pick)} of {len(docs)} documents in {time.perf_counter() - t0:.1f} s "
          f"({enc.format.projection}); the encoder goes to {out}", file=sys.stderr)
    return out


def _index_ray(args: argparse.Namespace) -> int:
    """``index --ray``: an actor pool on a Ray cluster encodes and upserts
    (:mod:`uibk_embedding.apps.distributed`)."""

    opts = _store_options(args)
    encoder: Any = args.encoder
    if args.dense or args.tokens:  # each actor composes the two folders itself

        encoder = functools.partial(load_encoder, args.encoder, dense=args.dense, tokens=args.tokens,
                                    trust_remote_code=bool(args.trust_remote_code), **_encoder_choice(args))
    options: dict[str, Any] = {"trust_remote_code": True} if args.trust_remote_code else {}
    if not (args.dense or args.tokens):
        options.update(_encoder_choice(args))
    if args.projection:  # as _load_encoder takes it, for each actor's encoder
        if args.dense or args.tokens:
            raise SystemExit("uibk-embed: --projection chooses the embedded model's projections; "
                             "it does not apply to --dense/--tokens")
        options["projection"] = args.projection
    try:
        r = index_distributed(
            args.data, args.backend, opts, encoder=encoder, encoder_options=options or None,
            pool_factor=args.pool_factor,
            encoder_urls=args.encoder_url or None,
            workers=args.workers, num_gpus=args.num_gpus or 0.0, batch_size=args.batch_size,
            store_text=args.store_text, resume=args.resume, skip_bad=args.skip_bad,
            ray_address=args.ray_address, progress=False if args.quiet else None)
    except ValueError as e:  # a store Ray workers cannot share, bad options; BadDocuments is a DataError
        if isinstance(e, DataError):
            raise
        raise SystemExit(f"uibk-embed: {e}") from None
    print(f"indexed {r.indexed} documents into {args.backend} with {len(r.worker_pids)} Ray worker "
          f"process(es) in {r.seconds:.1f} s ({r.docs_per_s:.1f} docs/s); encoded {r.encoded}, "
          f"already stored {r.skipped_existing}, bad {len(r.bad)}")
    for b in r.bad:
        print(f"  skipped {b}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    if not args.query.strip():
        raise UsageError("uibk-embed: the query is empty; give the text to search for")
    flt = _read_filter(args.filter)
    opts = _store_options(args)
    _read_backend(args, opts)
    _check_encoder_url(args)
    if args.encoder_url:  # the server's model encodes the query
        enc = RemoteEncoder(args.encoder_url)
    else:
        _adopt_the_stores_encoder(args, opts)
        enc = _load_encoder(args)
    ro = {"read_only": True} if args.backend in READ_ONLY_BACKENDS else {}  # shared with a writer
    store = adapters.open_store(args.backend, create=False, format=enc.format, **ro, **opts)  # makes nothing
    q = query_for_mode(enc.encode_queries([args.query], dense_weight=args.dense_weight)[0],
                       args.retrieval_mode)
    hits = store.search(q, k=args.k, filter=flt, explain=True)
    if args.json:
        print(json.dumps({"query": args.query, "backend": args.backend,
                          "encoder_backend": getattr(enc, "backend", None),  # None: a server, a PyLate model
                          "retrieval_mode": args.retrieval_mode, "hits": [h.as_dict() for h in hits]}))
    else:
        _print_hits(hits)
    store.close()
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """``uibk-embed stats --path P``: what a store holds and costs (``store.stats()``), the
    store opened read-only (the backend read from its folder, as ``search`` does)."""
    opts = _store_options(args)
    _read_backend(args, opts)
    ro = {"read_only": True} if args.backend in READ_ONLY_BACKENDS else {}
    store = adapters.open_store(args.backend, create=False, **ro, **opts)  # makes nothing
    try:
        stats = {"backend": args.backend, **store.stats()}
    finally:
        store.close()
    if args.json:
        print(json.dumps(stats))
        return 0
    n = stats.get("vectors")
    for key in ("bytes_on_disk", "resident_bytes"):
        if n and stats.get(key) is not None:
            stats[f"{key} per vector"] = round(stats[key] / n, 1)
    for key, value in stats.items():
        print(f"{key:>24}  {value}")
    return 0


def _read_backend(args: argparse.Namespace, opts: dict[str, Any]) -> None:
    """Check that a store to read is at ``opts`` (:class:`StoreNotFound` if not). A folder that
    another folder backend wrote is detected from that backend's own record: without
    ``--backend`` it is read with that backend (said on stderr); with another ``--backend`` the
    error names the backend to give. The detector is :func:`~uibk_embedding.adapters.registry.find_backend`,
    the one ``open_store(path=...)`` uses in Python."""
    if not getattr(args, "backend_given", True) and opts.get("path") is not None:
        found = find_backend(opts, default=args.backend)
        if found != args.backend:
            print(f"uibk-embed: {opts['path']} holds a {found} store; reading it with --backend {found}",
                  file=sys.stderr)
            args.backend = found
    try:
        require_store(args.backend, opts)
    except StoreNotFound as e:
        found = detect_backend(opts["path"], opts) if opts.get("path") is not None else None
        if found is None or found == args.backend:
            raise
        raise StoreNotFound(f"{e}; the folder holds a {found} store: give --backend {found}") from None


class _BackendGiven(argparse.Action):
    """``--backend NAME``, remembering that it was given (a read detects the backend otherwise)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.backend_given = True


def _read_filter(text: str | None) -> Any:
    """``--filter``'s JSON, checked before anything is loaded; a bad one is a one-line error."""
    if not text:
        return None
    try:
        flt = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"uibk-embed: --filter is not valid JSON ({e})") from None
    try:
        parse_filter(flt)
    except (ValueError, TypeError) as e:
        if os.environ.get(DEBUG_ENV):
            raise
        raise UsageError(f"uibk-embed: --filter: {e}") from None
    return flt


def cmd_eval(args: argparse.Namespace) -> int:
    """``eval DATA``: without a store location, index DATA's corpus into a temporary store (in
    memory for exact) and score it. With one (``--path``, a server option), score the store that is
    there AS IT IS: only the queries are encoded, the documents are its stored vectors, nothing is
    written. A missing (or empty) store is built only with ``--create``."""
    coll = load_beir(args.data, split=args.split)
    opts = _store_options(args)
    placed = _has_a_place(args.backend, opts)
    if args.create and not placed:
        raise SystemExit("uibk-embed: eval --create builds a store at --path (or on a server given by "
                         "--option); without one eval uses a temporary store anyway")
    new = False
    if placed:
        try:
            _read_backend(args, opts)  # before the encoder loads
        except StoreNotFound as e:
            if not args.create:
                raise StoreNotFound(f"{e}; `eval --create` indexes {args.data} into a new store there") \
                    from None
            new = True
        _adopt_the_stores_encoder(args, opts)
    enc = _load_encoder(args)
    w = args.dense_weight if args.dense_weight is not None else enc.dense_weight
    with tempfile.TemporaryDirectory() as tmp:
        if not placed:
            if args.backend == "plaid":
                opts["path"] = str(Path(tmp) / "index")
            store = adapters.open_store(args.backend, format=enc.format, **opts)
            new = True
        elif new:
            store = adapters.open_store(args.backend, format=enc.format, **opts)
        else:  # an existing store: read it; a server collection that --create may make is made here
            ro = {"read_only": True} if args.backend in READ_ONLY_BACKENDS and not args.create else {}
            store = adapters.open_store(args.backend, create=args.create, format=enc.format, **ro, **opts)
            if store.count() == 0:
                if not args.create:
                    store.close()
                    raise StoreNotFound(f"no store at {_where(args.backend, opts)} (it holds no documents; "
                                        f"`eval --create` indexes {args.data} into it)")
                new = True
        try:
            queries = {"queries": len(coll.queries)}
            if new:
                if placed:
                    print(f"indexing {len(coll.corpus)} documents into a new store at "
                          f"{_where(args.backend, opts)}", file=sys.stderr)
                lines = Progress(f"encoding {coll.name}", len(coll.corpus))
                with truncation_said_once(encoded={"documents": len(coll.corpus), **queries}):
                    encoded = encode_collection(enc, coll, use_cache=not args.no_cache,
                                                on_batch=lines.update if lines.enabled else None)
                index_into(store, encoded, coll)
            named = {d for rel in coll.qrels.values() for d in rel}
            if new:  # the qrels may name documents the corpus lacks (scored 0 without a word before)
                missing, where = named - set(encoded.doc_ids), f"the corpus of {args.data}"
            else:
                with truncation_said_once(encoded=queries):
                    encoded, missing = encode_queries_for_store(enc, coll, store)
                where = f"the store at {_where(args.backend, opts)}"
            held = len(encoded.doc_ids)
            # --create was asked to build the whole corpus: a store short of it (an index or an
            # `eval --create` stopped part-way) is read as it is, and said how to finish
            finish = (f"; the store has {held} of the {len(coll.corpus)} documents of {args.data}: run "
                      f"`{_index_command(args)}` to finish it" if not new and args.create
                      and held < len(coll.corpus) else "")
            if missing:
                print(f"uibk-embed eval: warning: {len(missing)} of {len(named)} documents the qrels name "
                      f"are not in {where} (it holds {held}); they cannot be found{finish}",
                      file=sys.stderr)
            elif finish:
                print(f"uibk-embed eval: warning: {finish[2:]}", file=sys.stderr)
            result = run_eval(coll, encoded, store, w)
            if args.retrieval_mode != "hybrid":
                result = _store_run_in_mode(result, coll, encoded, store, w, args.retrieval_mode)
            # in the JSON too: a script reading only stdout learns that the store lacks documents
            result.update(store_documents=held, qrels_documents_missing=len(missing))
        finally:
            store.close()
    if args.json:
        print(json.dumps(result))
    else:
        mode = args.retrieval_mode
        said = "" if mode == "hybrid" else f", the store searched in {mode} mode"
        print(f"{result['dataset']} on {result['backend']}, dense weight {w:g}{said}")
        width = max(8, *(len(h) + 1 for h in result["metrics"]))
        first = next(iter(result["metrics"].values()))
        print(f"{'head':<{width}}" + "".join(f"{m:>12}" for m in first))
        for head, ms in result["metrics"].items():
            print(f"{head:<{width}}" + "".join(f"{v:12.4f}" for v in ms.values()))
    return 0


def _store_run_in_mode(result: dict[str, Any], coll: Any, encoded: Any, store: Any, w: float,
                       mode: str, k: int = 100) -> dict[str, Any]:
    """``eval --retrieval-mode dense|tokens``: the store's own run with every query cut to that
    mode (:func:`~uibk_embedding.tagged.query_for_mode`, no re-index) replaces the hybrid
    ``fused`` run, under the key ``"MODE (store)"``; the exact ``dense`` and ``tokens`` heads stay
    beside it (``dense (store)`` is slot MaxSim, each query slot's best document slot, so it may
    rank a little differently from the ``dense`` head, the cosine of the concatenated slots)."""
    qs = [query_for_mode(with_dense_weight(q, w), mode) for q in encoded.queries]
    hits = store.search_batch(qs, k=k)
    run = {qid: [h.id for h in hs] for qid, hs in zip(encoded.query_ids, hits, strict=True)}
    metrics = {f"{mode} (store)": evaluate(run, coll.qrels)}
    metrics.update((head, m) for head, m in result["metrics"].items() if head != "fused")
    return {**result, "retrieval_mode": mode, "metrics": metrics}


def _index_command(args: argparse.Namespace) -> str:
    """The ``uibk-embed index`` command line that writes ``args.data``'s corpus into the store
    ``eval`` was given (its backend, ``--path``, ``--option`` and encoder options)."""
    words = ["uibk-embed", "index", args.data]
    if args.backend != "exact":
        words += ["--backend", args.backend]
    for flag in ("path", "encoder", "dense", "tokens", "projection", "revision", "encoder_backend"):
        if getattr(args, flag, None):
            words += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for o in args.option:
        words += ["--option", o]
    if args.trust_remote_code:
        words.append("--trust-remote-code")
    return " ".join(shlex.quote(w) for w in words)


def _where(backend: str, opts: dict[str, Any]) -> str:
    """Where a store lives, for messages: its path, else its server."""
    for k in ("path", "url", "uri", "host", "dsn", "location"):
        if opts.get(k):
            return str(opts[k])
    return f"the {backend} server"


def cmd_export_pylate(args: argparse.Namespace) -> int:
    """``export-pylate OUT``: the encoder as a PyLate ColBERT model folder (``save_pylate``)."""
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # never over another model
        raise SystemExit(f"uibk-embed: {out} is not an empty folder: the PyLate model needs a new one")
    enc = _load_encoder(args)
    if not hasattr(enc, "save_pylate"):
        raise SystemExit(f"uibk-embed: a {type(enc).__name__} cannot be saved as a PyLate model")
    try:
        out = enc.save_pylate(args.out)
    except NotImplementedError as e:
        raise SystemExit(f"uibk-embed: {e}; `uibk-embed export-st OUT` writes it as a "
                         "sentence-transformers 6 folder") from None
    print(f"saved a PyLate model to {out}: pylate.models.ColBERT({str(out)!r}, trust_remote_code=True) "
          f"in PyLate's own environment (PyLate pins sentence-transformers 5), or --encoder {out} "
          "--trust-remote-code here; for sentence-transformers 6's MultiVectorEncoder: uibk-embed export-st")
    return 0


def cmd_export_st(args: argparse.Namespace) -> int:
    """``export-st OUT``: the encoder as a sentence-transformers 6 ``MultiVectorEncoder`` folder
    (``save_sentence_transformers``; a composed encoder too)."""
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # never over another model
        raise SystemExit(f"uibk-embed: {out} is not an empty folder: the model needs a new one")
    enc = _load_encoder(args)
    try:
        out = save_sentence_transformers(enc, out)
    except (NotImplementedError, ValueError) as e:
        raise SystemExit(f"uibk-embed: {e}") from None
    print(f"saved a sentence-transformers 6 model to {out}: sentence_transformers.MultiVectorEncoder("
          f"{str(out)!r}, trust_remote_code=True), or --encoder {out} --trust-remote-code")
    return 0


def cmd_fit_projection(args: argparse.Namespace) -> int:
    if args.dense or args.tokens:
        raise SystemExit("uibk-embed: fit-projection fits one model folder's P (--encoder); the "
                         "token head of --dense/--tokens keeps its fixed R'")
    docs = read_corpus(args.data)
    if len(docs) > args.max_docs:  # evenly spaced over the corpus, deterministic
        step = len(docs) / args.max_docs
        docs = [docs[int(i * step)] for i in range(args.max_docs)]
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SystemExit(f"uibk-embed: {out} is not an empty folder: the fitted encoder needs a new one "
                         "(an encoder already there, perhaps a store's, is never overwritten)")
    enc = _load_encoder(args)
    if not hasattr(enc, "fit_projection"):
        raise SystemExit(f"uibk-embed: {type(enc).__name__} has no projection to fit")
    t0 = time.perf_counter()
    try:
        enc.fit_projection([d.full_text for d in docs], max_token_rows=args.max_token_rows)
    except ValueError as e:
        raise SystemExit(f"uibk-embed: {e}") from None
    enc.save_projections(args.out)
    print(f"fitted P {enc.P.shape} by PCA on {len(docs)} documents (R {enc.R.shape}: the seeded one) "
          f"in {time.perf_counter() - t0:.1f} s (projection {projection_id(enc.R, enc.P)})")
    print(f"saved to {args.out}; use it on both sides: --encoder {args.out}")
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    if args.query is not None and not args.query.strip():
        raise UsageError("uibk-embed: the query is empty; give the text to search for (or leave out --query)")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n"
                                  for i, t in QUICKSTART_CORPUS))
        print(f"wrote {len(QUICKSTART_CORPUS)} documents to {corpus} (a temporary folder, removed when "
              "quickstart ends)")
        enc = _load_encoder(args)
        print(f"encoder: {getattr(enc, 'model_name', type(enc).__name__)} "
              f"(beta={enc.format.beta}, lambda={enc.format.lambda_}, "
              f"dense weight {enc.dense_weight:g})")
        ids = [i for i, _ in QUICKSTART_CORPUS]
        texts = [t for _, t in QUICKSTART_CORPUS]
        path = Path(tmp) / "store"
        with adapters.open_store("exact", path=path, format=enc.format) as store:
            store.upsert(ids, enc.encode_documents(texts), [{"text": t} for t in texts])
        print(f"indexed into an exact store at {path} (temporary too); reopening it")
        query = args.query or QUICKSTART_QUERY
        print(f"\nquery: {query}\n")
        q = enc.encode_queries([query])[0]
        with adapters.open_store("exact", path=path, format=enc.format, create=False) as store:
            _print_hits(store.search(q, k=args.k, explain=True))
    print(f"\nremoved the temporary folder {tmp}; to keep a store, index your own documents: "
          "uibk-embed index corpus.jsonl --path ./my-index")
    return 0


def _delegate(module: str, func: str = "main"):
    def run(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), func)(args.rest) or 0)

    return run


_MODE_HELP = ("hybrid (default: slots and tokens), dense (the query's slot rows only) or tokens (its "
              "token rows only), per query, no re-index")
_W_HELP = ("the query-time dense weight w (positive; default: the encoder's own, 4 for the embedded "
           "model): the query slots are scaled by w, no re-indexing")


def build_parser() -> argparse.ArgumentParser:
    """The ``uibk-embed`` parser (``serve`` and ``compare`` parse their own arguments).

    >>> build_parser().parse_args(["search", "wing", "-k", "3"]).k
    3
    """
    p = argparse.ArgumentParser(prog="uibk-embed", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"uibk-embed {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser, store: bool = True) -> None:
        sp.add_argument("--encoder", default=None,
                        help="encoder folder: saved by this library, a PyLate model such as the released "
                             "UIBK-Embedding-v1 (with --trust-remote-code), a Hugging Face folder "
                             "(default: the embedded all-MiniLM-L6-v2 model)")
        sp.add_argument("--dense", default=None, metavar="FOLDER",
                        help="bring your own models: a sentence-transformers folder (with --tokens; "
                             "with --encoder SAVED: where the saved encoder's dense model moved)")
        sp.add_argument("--tokens", default=None, metavar="FOLDER",
                        help="bring your own models: a ColBERT folder sentence-transformers 6's "
                             "MultiVectorEncoder loads (its own save, PyLate's format, Stanford "
                             "ColBERT; with --dense)")
        sp.add_argument("--trust-remote-code", action="store_true",
                        help="let a PyLate model folder (--encoder) run the Python code it ships, "
                             "e.g. the released UIBK-Embedding-v1's custom modules (read it first)")
        sp.add_argument("--encoder-backend", choices=ENCODER_BACKENDS, default=None,
                        help="what runs the embedded default's network on the CPU: torch (default), onnx "
                             "(ONNX Runtime) or openvino (OpenVINO), the same lists within float32 "
                             "noise, or openvino-bf16 (bfloat16 where the CPU has it; within 0.3 "
                             "nDCG@10 points: docs/loading.md)")
        sp.add_argument("--revision", default=None,
                        help="branch, tag or commit of a Hugging Face Hub id given as --encoder, "
                             "--dense or --tokens (pin a commit for reproducible lists)")
        sp.add_argument("--projection", choices=["random", "pca"], default=None,
                        help="the embedded model's projections R and P: random (seed 0, the "
                             "default) or the shipped PCA fit (pca, the default of 0.2.0: open 0.2.0 "
                             "stores with it); stores record it and refuse another")
        if store:
            sp.add_argument("--backend", default="exact", choices=sorted(BACKENDS), action=_BackendGiven,
                            help="the store's engine (default: exact; search and eval read a folder "
                                 "store with the backend that wrote it)")
            sp.set_defaults(backend_given=False)
            sp.add_argument("--path", default=None, help="store location (backend option path)")
            sp.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                            help="backend option, repeatable")

    sp = sub.add_parser("quickstart", help="index a small built-in corpus and answer a query")
    sp.add_argument("--query", default=None,
                    help="the query to answer (default: one about a propeller slipstream)")
    sp.add_argument("-k", type=_positive_int, default=5, help="hits to print (default 5)")
    common(sp, store=False)
    sp.set_defaults(func=cmd_quickstart)

    sp = sub.add_parser("index", help="index a BEIR folder or a JSONL file")
    sp.add_argument("data")
    sp.add_argument("--fit-projection", action="store_true",
                    help="fit the token projection P by PCA on the documents being indexed (no labels) "
                         "and save the encoder with the store (exact/plaid/warp: inside --path, found "
                         "by `search`; other backends: --save-encoder DIR). Not a default anywhere: "
                         "docs/model.md says when it helps")
    sp.add_argument("--fit-sample", type=_positive_int, default=None,
                    help=f"documents the fit reads at most (a seeded random sample; default {FIT_SAMPLE})")
    sp.add_argument("--save-encoder", default=None, metavar="DIR",
                    help="where --fit-projection saves the fitted encoder")
    sp.add_argument("--batch-size", type=_positive_int, default=256,
                    help="documents encoded and upserted together (default 256)")
    sp.add_argument("--profile", choices=list(PROFILES), default=None,
                    help="what the exact store keeps: exact (float32 rows, the default), float16, "
                         "compact (rotated 4-bit rows only, 0.15x of exact on disk), exact-rerank "
                         "(rotated 2-bit rows scanned, the best reranked exactly from float16 "
                         "originals on disk), int8 or int8-rerank (the same with int8 rows); "
                         "recorded with the store (docs/compact.md)")
    sp.add_argument("--pool-factor", type=_pool_factor_arg, default=None, metavar="N",
                    help="token pooling at index time: each document keeps max(n // N, 1) of its n token "
                         "vectors, merged by clustering (slots and queries never pooled; the store "
                         "records N and refuses documents of another; default 1, off; docs/format.md)")
    sp.add_argument("--pool-method", choices=list(POOL_METHODS), default=None,
                    help="how --pool-factor merges token vectors: content (the default: function words "
                         "out, content words merged within segments; the token ids in 90%% of the "
                         "corpus count as function words, recorded with the store) or ward (Ward's "
                         "clustering of every token, PyLate's pool_factor)")
    sp.add_argument("--no-store-text", dest="store_text", action="store_false",
                    help="do not keep the text in the metadata")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.add_argument("--encoder-url", action="append", default=[], metavar="URL",
                    help="a `uibk-embed serve` server to encode with (repeatable; with --ray the "
                         "actors share them)")
    ray = sp.add_argument_group("scale out on Ray (the `ray` extra; docs/distributed.md)")
    ray.add_argument("--ray", action="store_true",
                     help="encode and upsert on a pool of Ray actors (a store server is needed)")
    ray.add_argument("--ray-address", default=None,
                     help="the Ray cluster (default: a running one, else a new local one)")
    ray.add_argument("--workers", type=_positive_int, default=None,
                     help="actors in the pool (default: one per GPU with --num-gpus, else 2)")
    ray.add_argument("--num-gpus", type=float, default=None, help="GPUs per actor (1: one encoder per GPU)")
    ray.add_argument("--resume", action="store_true", help="skip ids the store already holds")
    ray.add_argument("--skip-bad", action="store_true",
                     help="leave out rows with an empty or non-string text (listed) instead of failing")
    common(sp)
    sp.set_defaults(func=cmd_index)

    sp = sub.add_parser("search", help="search a store; hits with their decomposition")
    sp.add_argument("query")
    sp.add_argument("-k", type=_positive_int, default=10, help="hits to return (default 10)")
    sp.add_argument("--dense-weight", type=_dense_weight, default=None, help=_W_HELP)
    sp.add_argument("--filter", default=None,
                    help='a metadata filter as JSON, e.g. {"lang": "en"} or {"year": {"$gte": 1960}}')
    sp.add_argument("--retrieval-mode", choices=RETRIEVAL_MODES, default="hybrid", help=_MODE_HELP)
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--encoder-url", default=None, metavar="URL",
                    help="a `uibk-embed serve` server to encode the query with (the one the store was "
                         "indexed with, or one serving the same model)")
    common(sp)
    sp.set_defaults(func=cmd_search)

    sp = sub.add_parser("stats", help="what a store holds and costs: documents, vectors, bytes on disk "
                                      "and resident")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--backend", default="exact", choices=sorted(BACKENDS), action=_BackendGiven,
                    help="the store's engine (default: the one that wrote the folder at --path)")
    sp.set_defaults(backend_given=False)
    sp.add_argument("--path", default=None, help="store location (backend option path)")
    sp.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="backend option, repeatable")
    sp.set_defaults(func=cmd_stats)

    sp = sub.add_parser(
        "eval", help="nDCG@10 and recall of fused, dense-only and token-only",
        description="Score DATA's queries. Without --path (or a server option) the corpus is indexed "
                    "into a temporary store. With --path, the store there is evaluated as it is: only "
                    "the queries are encoded, nothing is written (a warning says how many documents "
                    "of the qrels it lacks; --json gives store_documents and qrels_documents_missing); "
                    "a missing store is an error (exit 2) unless --create.")
    sp.add_argument("data")
    sp.add_argument("--create", action="store_true",
                    help="when no store (or an empty one) is at --path, index DATA's corpus into a new "
                         "one there first (it says so); an existing store is never written")
    sp.add_argument("--split", default="test",
                    help="the qrels split to score (qrels/SPLIT.tsv; default test)")
    sp.add_argument("--dense-weight", type=_dense_weight, default=None, help=_W_HELP)
    sp.add_argument("--retrieval-mode", choices=RETRIEVAL_MODES, default="hybrid",
                    help=_MODE_HELP + "; dense or tokens: the store's run in that mode replaces fused")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--no-cache", action="store_true", help="do not cache encoded vectors")
    common(sp)
    sp.set_defaults(func=cmd_eval)

    sp = sub.add_parser("fit-projection",
                        help="fit the token projection P by PCA on a corpus (R stays seeded); save an "
                             "encoder folder")
    sp.add_argument("data", help="BEIR folder or JSONL corpus: the sample to fit on")
    sp.add_argument("--out", required=True, help="folder to save the fitted encoder to")
    sp.add_argument("--max-docs", type=_positive_int, default=5000,
                    help="documents of the sample, evenly spaced over the corpus (default 5000)")
    sp.add_argument("--max-token-rows", type=_positive_int, default=200_000,
                    help="token states used to fit P (default 200000)")
    common(sp, store=False)
    sp.set_defaults(func=cmd_fit_projection)

    sp = sub.add_parser("export-pylate",
                        help="save the encoder as a PyLate model folder (custom modules; load it with "
                             "trust_remote_code=True)")
    sp.add_argument("out", help="folder to write")
    common(sp, store=False)
    sp.set_defaults(func=cmd_export_pylate)

    sp = sub.add_parser("export-st",
                        help="save the encoder (--dense/--tokens too) as a sentence-transformers 6 "
                             "MultiVectorEncoder folder (custom modules; load it with "
                             "trust_remote_code=True)")
    sp.add_argument("out", help="folder to write")
    common(sp, store=False)
    sp.set_defaults(func=cmd_export_st)

    for name, module, help_ in [
        ("serve", "uibk_embedding.encoder.server", "serve the shared encoder over HTTP"),
        ("compare", "uibk_embedding.apps.compare", "compare backends on a collection"),
    ]:
        sp = sub.add_parser(name, help=help_, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=_delegate(module))
    return p


class UsageError(SystemExit):
    """A user error: exit status 2, ``str()`` the message (printed on stderr by :func:`main`).

    >>> e = UsageError("uibk-embed: the query is empty")
    >>> e.code, str(e)
    (2, 'uibk-embed: the query is empty')
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = 2


# what a user can cause: bad input (a filter, a query, a file), a missing store, model or server,
# a missing extra. Everything else (AttributeError, IndexError, a plain RuntimeError...) is a bug
# in this library and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (UIBKError, ValueError, TypeError, KeyError, OSError,
                                                 ImportError, NotImplementedError)
DEBUG_ENV = "UIBK_EMBED_DEBUG"


def _one_line(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    text = "; ".join(lines)
    return text if text.startswith("uibk-embed") else f"uibk-embed: {text}"


def _message(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"--filter is not valid JSON ({e})"
    if isinstance(e, KeyError) and len(e.args) == 1:
        return f"not found: {e.args[0]}"
    return str(e) or type(e).__name__


def _run_reporting_user_errors(run: Any, *args: Any) -> int:
    """``run(*args)`` with every user error turned into one line on stderr and exit status 2."""
    try:
        return run(*args)
    except UsageError as e:
        message = _one_line(str(e))
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):  # argparse (2, usage printed), a clean exit
            raise
        message = _one_line(str(e.code))
    except KeyboardInterrupt:
        print("uibk-embed: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except USER_ERRORS as e:
        if os.environ.get(DEBUG_ENV):
            raise
        message = _one_line(_message(e))
    print(message, file=sys.stderr)
    raise UsageError(message) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``uibk-embed``; returns the exit status.

    Every user error, in every subcommand, is ONE line ``uibk-embed: <the problem>`` on stderr
    and exit status 2 (the :class:`SystemExit` raised is a :class:`UsageError`, whose ``str()`` is
    the line): a bad ``--filter`` (malformed JSON, an unknown operator),
    an empty query, a missing file or store, a model folder of the wrong kind, a server that
    cannot be reached, a missing extra — the library's :class:`~uibk_embedding.errors.UIBKError`
    and the ``ValueError``, ``TypeError``, ``KeyError``, ``OSError``, ``ImportError`` and
    ``NotImplementedError`` its input checks raise. Anything else (``AttributeError``,
    ``IndexError``, a plain ``RuntimeError``...) is a bug and keeps its traceback; set
    ``UIBK_EMBED_DEBUG=1`` to see the traceback of a user error too. Ctrl-C: exit status 130.
A command line argparse cannot parse (a missing argument, an unknown option) gets argparse's
usage and error lines and exit status 2.

    >>> import pathlib, tempfile
    >>> missing = pathlib.Path(tempfile.mkdtemp()) / "missing"
    >>> try:
    ...     main(["eval", str(missing)])
    ... except SystemExit as e:
    ...     print(str(e).replace(str(missing), "MISSING"))
    uibk-embed: MISSING is not a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)
    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     try:
    ...         main(["search", "a wing", "--path", str(missing)])   # a read creates nothing
    ...     except SystemExit as e:
    ...         print("exit status", e.code)
    exit status 2
    >>> print(err.getvalue().replace(str(missing), "MISSING"), end="")
    uibk-embed: no store at MISSING (no exact store: the path does not exist; nothing was created)
    >>> missing.exists()
    False
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = {"serve": "uibk_embedding.encoder.server", "compare": "uibk_embedding.apps.compare"}
    if argv and argv[0] in delegated:  # argparse.REMAINDER refuses leading options ("serve --port 1")
        with warnings_said_as_lines():
            return _run_reporting_user_errors(_delegate(delegated[argv[0]]),
                                              argparse.Namespace(rest=argv[1:]))
    args = build_parser().parse_args(argv)
    with warnings_said_as_lines():
        return _run_reporting_user_errors(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
