"""Multi-vector model folders (sentence-transformers 6, PyLate): load one as an encoder of ours,
save ours as one.

The released UIBK-Embedding-v1 (docs/model.md) is a PyLate ColBERT model with custom modules, whose
``ColBERT.encode(texts, is_query=...)`` returns the tagged lists themselves. This module makes
such a folder an :class:`~uibk_embedding.encoder.protocol.Encoder` like every other
(:class:`PyLateEncoder`, what ``load_encoder(folder, trust_remote_code=True)`` returns for a
folder with ``modules.json`` and a ``config_sentence_transformers.json`` of sentence-transformers
6's ``MultiVectorEncoder`` or of PyLate), and writes our own encoders in both formats
(:func:`save_sentence_transformers`, :func:`save_pylate`, ``encoder.save_pylate(folder)``).

Loading runs sentence-transformers 6's ``MultiVectorEncoder`` (:func:`load_multi_vector_model`:
its prompts, lengths, query expansion, skiplist and modules; PyLate is not needed), batched by our
pipeline (a background tokeniser, batches by a token budget, one copy to the host per batch). A
PyLate folder in :func:`save_pylate`'s layout is read by its files with this package's
sentence-transformers 6 modules (``pylate_modules/tagged_modules.py``): its own modules are
written for PyLate. Before the encoder is returned, its output on a probe is checked
(:func:`probe_format`): 128 dims, unit rows, coordinate 0 one negative value on the first 3 rows
(the slots) and one positive value on the others (the tokens); ``beta`` and ``lambda`` are read
from the two tag values and the docs/format.md#identity identity is verified. The format's
``projection`` is ``"pylate-<hash>"``, a content hash of the files the model's modules load, so a
store filled by this model refuses another one.

A folder that would run Python code of its own when it loads (a ``modules.json`` type that is
not an exact installed sentence-transformers / PyLate class, an ``auto_map``, a file shadowing
an installed package: :func:`~uibk_embedding.encoder.trust.code_risks`) is refused unless
``trust_remote_code=True`` (CLI: ``--trust-remote-code``), before anything loads; the libraries
are then called with the same ``trust_remote_code``.

Example (a tiny random UIBK model, exported and loaded back)::

    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.encoder.pylate_model import save_sentence_transformers
    from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
    cfg = UIBKConfig.tiny()
    native = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["lift of a wing"]))
    save_sentence_transformers(native, "tiny-st")  # MultiVectorEncoder("tiny-st", trust_remote_code=True)
    enc = load_encoder("tiny-st", trust_remote_code=True)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding.encoder import pylate_modules
from uibk_embedding.encoder.base import TaggedEncoder
from uibk_embedding.encoder.inputs import resolve_device, resolve_dtype
from uibk_embedding.encoder.padding import TokenBatch
from uibk_embedding.encoder.pipeline import Pending, to_host
from uibk_embedding.encoder.transformer import TransformerEncoder, quiet_transformers
from uibk_embedding.encoder.trust import LIBRARY_MODULES, check_loader_options, digest_files, require_trust
from uibk_embedding.encoder.uibk import UIBKEncoder
from uibk_embedding.errors import MissingDependency
from uibk_embedding.tagged import BODY, DIM, N_SLOTS, TAG_RTOL, TaggedFormat, apply_dense_weight

MODULES_NAME = "modules.json"
ST_CONFIG_NAME = "config_sentence_transformers.json"
#: keys PyLate writes into config_sentence_transformers.json (sentence-transformers does not)
PYLATE_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length",
               "do_query_expansion", "attend_to_expansion_tokens", "skiplist_words")
_DOC_PROMPTS = ("document", "passage", "corpus")
_UNHASHED = {"README.md"}
#: the block of config_sentence_transformers.json where save_pylate records what it exported
OUR_BLOCK = "uibk_embedding"

PROBE_QUERIES = ("what is the lift of a wing in a slipstream",
                 "heat transfer in a laminar boundary layer", "how does a swept wing stall?")
PROBE_DOCUMENTS = ("experimental investigation of the lift of a wing in the slipstream of a propeller",
                   "the boundary layer over a flat plate, with heat transfer and suction",
                   "stall of swept wings at low speed: a wind tunnel study", "a")


# -- what a folder is ------------------------------------------------------------------------
def is_pylate_folder(folder: str | os.PathLike) -> bool:
    """A multi-vector model folder: ``modules.json`` and a ``config_sentence_transformers.json``
    with ``model_type`` MultiVectorEncoder (sentence-transformers 6), ColBERT or PyLate's own keys.

    >>> import tempfile, pathlib, json
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "modules.json").write_text("[]")
    >>> is_pylate_folder(d)
    False
    >>> _ = (d / "config_sentence_transformers.json").write_text(json.dumps({"query_length": 32}))
    >>> is_pylate_folder(d)
    True
    """
    p = Path(folder)
    if not (p / MODULES_NAME).is_file() or not (p / ST_CONFIG_NAME).is_file():
        return False
    try:
        cfg = json.loads((p / ST_CONFIG_NAME).read_text())
    except json.JSONDecodeError:
        return False
    return (cfg.get("model_type") in ("ColBERT", "MultiVectorEncoder")
            or any(k in cfg for k in PYLATE_KEYS))


def _modules(folder: Path) -> list[dict[str, Any]]:
    mods = json.loads((folder / MODULES_NAME).read_text())
    if not isinstance(mods, list) or not all(isinstance(m, dict) and "type" in m for m in mods):
        raise ValueError(f"{folder / MODULES_NAME}: expected a list of modules with a 'type'")
    return mods


def custom_code(folder: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The module classes of ``modules.json`` that are not the exact installed
    sentence-transformers / PyLate classes (:data:`~uibk_embedding.encoder.trust.LIBRARY_MODULES`;
    ``pylate.Dense`` is not one: it names the folder's ``pylate.py``), and the Python files of
    the folder (the code that would run on loading). Every reason a folder would run its own
    code, ``auto_map`` included, is :func:`~uibk_embedding.encoder.trust.code_risks`.

    >>> import tempfile, pathlib, json
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "modules.json").write_text(json.dumps([
    ...     {"type": "sentence_transformers.models.Transformer"}, {"type": "hybrid.Hybrid"},
    ...     {"type": "pylate.Dense"}]))
    >>> _ = (d / "hybrid.py").write_text("")
    >>> custom_code(d)
    (['hybrid.Hybrid', 'pylate.Dense'], ['hybrid.py'])
    """
    p = Path(folder)
    classes = [str(m["type"]) for m in _modules(p) if str(m["type"]) not in LIBRARY_MODULES]
    files = sorted(f.relative_to(p).as_posix() for f in p.rglob("*.py")
                   if not any(part.startswith(".") or part == "__pycache__"
                              for part in f.relative_to(p).parts))
    return classes, files if classes else []


def model_files(folder: str | os.PathLike) -> list[Path]:
    """The files the model's modules load: those at the root of the folder and in each module's
    own folder (``modules.json``, ``path``), not the whole tree; ``README.md`` and hidden files
    left out.

    >>> import tempfile, pathlib, json
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "1_Dense").mkdir(); (d / "other").mkdir()
    >>> _ = (d / "modules.json").write_text(json.dumps([{"type": "a.B", "path": ""},
    ...                                                 {"type": "c.D", "path": "1_Dense"}]))
    >>> for f in ("1_Dense/config.json", "other/unused.bin", "README.md"): _ = (d / f).write_text("")
    >>> [p.relative_to(d).as_posix() for p in model_files(d)]
    ['1_Dense/config.json', 'modules.json']
    """
    p = Path(folder)
    dirs = {p} | {p / str(m.get("path", "")) for m in _modules(p)}
    out = []
    for d in sorted(dirs):
        if d.is_dir():
            out += [f for f in d.iterdir()
                    if f.is_file() and f.name not in _UNHASHED and not f.name.startswith(".")]
    for d in _composed_model_dirs(p):  # a composed export: both model folders, whole
        out += [f for f in d.rglob("*") if f.is_file() and f.name not in _UNHASHED
                and not any(part.startswith(".") or part == "__pycache__" for part in f.relative_to(d).parts)]
    return sorted(set(out))


def _composed_model_dirs(folder: Path) -> list[Path]:
    """The two model folders a composed export's ``composed_input.json`` names (none for other
    folders)."""
    try:
        cfg = json.loads((folder / "composed_input.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(cfg, dict):
        return []
    names = [cfg.get("dense_folder", "dense"), cfg.get("tokens_folder", "tokens")]
    return [folder / str(n) for n in names if isinstance(n, str) and (folder / n).is_dir()]


def model_hash(folder: str | os.PathLike) -> str:
    """A short content hash of :func:`model_files` (relative path, size, bytes): the
    ``projection`` record of a PyLate model's format.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "modules.json").write_text("[]")
    >>> a = model_hash(d); _ = (d / "README.md").write_text("a model card")
    >>> model_hash(d) == a, len(a)
    (True, 16)
    >>> _ = (d / "model.safetensors").write_bytes(b"weights"); model_hash(d) == a
    False
    """
    return digest_files(Path(folder), model_files(folder))[:16]


# -- the probe ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeReport:
    """What :func:`probe_format` measured on the probe's lists."""

    lists: int
    token_tag: float
    slot_tag: float
    beta_measured: float
    lambda_measured: float
    pairs: int
    aligned_pairs: int
    max_identity_error: float


def _snap(x: float, tol: float) -> float:
    """``x`` on a 0.05 grid when it is that close (a bfloat16 model's tags are rounded), else
    to 4 decimals: the same model gives the same format on any device."""
    grid = round(x * 20) / 20
    return grid if abs(x - grid) <= tol else round(x, 4)


def _untagged(what: str) -> ValueError:
    return ValueError(
        f"{what}: its lists are not tagged lists of the UIBK format (docs/format.md#constants): "
        "a plain ColBERT model? Compose it with a dense model instead: "
        "load_encoder(dense=SENTENCE_TRANSFORMERS_FOLDER, tokens=THIS_FOLDER) "
        "(CLI: --dense ... --tokens ...)")


def probe_format(queries: list[np.ndarray], documents: list[np.ndarray], *,
                 what: str = "the model") -> tuple[TaggedFormat, ProbeReport]:
    """Check that lists are tagged lists and read their format back (``projection`` unset).

    Every row must be a unit 128-d vector; in every list coordinate 0 is negative on the first
    3 rows (slots) and positive on the others (tokens), one value each across all lists. Then
    ``beta = 1 - token_tag^2``, ``delta = 1 - slot_tag^2``, ``lambda = 3 delta / beta``, and on
    every query/document pair plain MaxSim must equal ``C(q) + beta (s_tok + lambda dense)``
    where the slots align and tokens select tokens (docs/format.md#identity), and be at least that elsewhere.

    >>> fmt = TaggedFormat(); rng = np.random.default_rng(0)
    >>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
    >>> got, report = probe_format([mk(4), mk(2)], [mk(9), mk(5)])
    >>> got.beta, got.lambda_, report.pairs
    (0.9, 0.75, 4)
    >>> probe_format([np.ones((4, 96)) / np.sqrt(96)], [np.ones((4, 96)) / np.sqrt(96)])
    Traceback (most recent call last):
    ...
    ValueError: the model: its vectors have 96 dimensions; the tagged format has 128 (docs/format.md...
    """
    lists = [np.asarray(x, dtype=np.float64) for x in [*queries, *documents]]
    for x in lists:
        if x.ndim != 2 or x.shape[1] != DIM:
            dims = x.shape[-1] if x.ndim else 0
            raise ValueError(f"{what}: its vectors have {dims} dimensions; the tagged format has "
                             f"{DIM} (docs/format.md#constants): not a UIBK-Embedding model")
    norms = np.concatenate([np.linalg.norm(x, axis=1) for x in lists])
    if not np.all(np.isfinite(norms)) or np.max(np.abs(norms - 1)) > 1e-3:
        raise ValueError(f"{what}: its vectors are not unit vectors (norms {norms.min():.4f} to "
                         f"{norms.max():.4f}); tagged lists are")
    tags = [x[:, 0] for x in lists]
    # a tagged list: its first rows negative (slots), all the others positive (tokens)
    leading = [int(np.argmax(t >= 0)) if (t >= 0).any() else len(t) for t in tags]
    prefix = all(int((t < 0).sum()) == k for t, k in zip(tags, leading, strict=True))
    if not prefix or len(set(leading)) != 1 or leading[0] == 0:
        raise _untagged(what)
    if leading[0] != N_SLOTS:
        raise ValueError(f"{what}: its lists have {leading[0]} slot rows (negative coordinate 0); "
                         f"the tagged format has {N_SLOTS}")
    tok = np.concatenate([t[N_SLOTS:] for t in tags])
    slot = np.concatenate([t[:N_SLOTS] for t in tags])
    if len(tok) == 0:
        raise ValueError(f"{what}: the probe gave no token rows")
    for name, v in (("token", tok), ("slot", slot)):
        if v.max() - v.min() > 5e-3:
            raise _untagged(f"{what} ({name} rows' coordinate 0 ranges over {v.min():.4f} .. {v.max():.4f}, "
                            "not one value)")
    t_tag, s_tag = float(np.median(tok)), float(np.median(slot))
    beta_m = 1 - t_tag ** 2
    delta_m = 1 - s_tag ** 2
    lambda_m = N_SLOTS * delta_m / beta_m
    beta = _snap(beta_m, 2e-3)
    lam = _snap(lambda_m, 1.5e-2)
    fmt = TaggedFormat(beta=beta, lambda_=lam)  # refuses a lambda breaking property (i)
    if (abs(fmt.token_tag - t_tag) > TAG_RTOL / 2 * abs(t_tag)
            or abs(fmt.slot_tag - s_tag) > TAG_RTOL / 2 * abs(s_tag)):
        # the grid's tags would sit past half of what a store's tag check takes (beta 0.9018 read
        # as 0.9 made lists every store refused): the measured constants
        fmt = TaggedFormat(beta=round(beta_m, 4), lambda_=round(lambda_m, 4))
    if abs(fmt.token_tag - t_tag) > 5e-3 or abs(fmt.slot_tag - s_tag) > 5e-3:
        raise _untagged(f"{what} (tags {t_tag:.4f} / {s_tag:.4f} fit no beta, lambda)")
    worst, pairs, aligned = 0.0, 0, 0
    for q in lists[: len(queries)]:
        for d in lists[len(queries):]:
            sims = q @ d.T
            best = sims.argmax(axis=1)
            maxsim = float(sims.max(axis=1).sum())
            if (best[:N_SLOTS] < N_SLOTS).sum() < N_SLOTS:
                raise ValueError(f"{what}: a query slot selected a document token: property (i) of "
                                 "docs/format.md#identity fails on the probe")
            qu, du = q[N_SLOTS:, 1:] / math.sqrt(fmt.beta), d[N_SLOTS:, 1:] / math.sqrt(fmt.beta)
            qg, dg = q[:N_SLOTS, 1:] / math.sqrt(fmt.delta), d[:N_SLOTS, 1:] / math.sqrt(fmt.delta)
            s_tok = float((qu @ du.T).max(axis=1).sum()) if len(du) else 0.0
            dense = float(np.mean(np.einsum("ij,ij->i", qg, dg)))
            closed = fmt.constant(len(qu)) + fmt.beta * (s_tok + fmt.lambda_ * dense)
            tol = 1e-3 * (1 + abs(maxsim))
            if maxsim < closed - tol:
                raise ValueError(f"{what}: MaxSim {maxsim:.5f} is below C(q) + beta (s_tok + lambda "
                                 f"dense) = {closed:.5f}: the identity fails (docs/format.md#identity) "
                                 "on the probe")
            separated = (bool(np.all(best[N_SLOTS:] >= N_SLOTS))
                         and bool(np.all(best[:N_SLOTS] == np.arange(N_SLOTS))))
            if separated and len(du):
                aligned += 1
                err = abs(maxsim - closed)
                if err > tol:
                    raise ValueError(f"{what}: MaxSim {maxsim:.5f} != C(q) + beta (s_tok + lambda dense) "
                                     f"= {closed:.5f} on an aligned pair: the identity fails "
                                     "(docs/format.md#identity)")
                worst = max(worst, err)
            pairs += 1
    return fmt, ProbeReport(len(lists), t_tag, s_tag, beta_m, lambda_m, pairs, aligned, worst)


# -- the encoder -------------------------------------------------------------------------------
#: the module types of a PyLate model folder written by save_pylate (uibk-embedding <= 0.3 wrote
#: only this export): loaded with the installed sentence-transformers 6 modules of this package
#: (tagged_modules.py), which read the same files, so PyLate is not needed to load it
_OUR_PYLATE_TYPES = ["branched_transformer.BranchedTransformer", "hybrid_tokens.HybridTokens"]


def _our_pylate_export(folder: Path) -> dict[str, Any] | None:
    """The ``config_sentence_transformers.json`` of a PyLate folder in :func:`save_pylate`'s layout
    (its two module types, ``branched_transformer.json``, ``1_HybridTokens``' projections; also
    after PyLate saved it again, which drops our block of the configuration), else None."""
    try:
        mods = _modules(folder)
        cfg = json.loads((folder / ST_CONFIG_NAME).read_text())
    except (OSError, ValueError, KeyError):
        return None
    if ([str(m["type"]) for m in mods] != _OUR_PYLATE_TYPES or cfg.get("model_type") != "ColBERT"
            or not (folder / "branched_transformer.json").is_file()
            or not (folder / str(mods[1].get("path", "")) / "projections.safetensors").is_file()):
        return None
    return cfg


def _sentence_transformers_6(purpose: str) -> Any:
    """sentence-transformers with ``MultiVectorEncoder`` (6.0 or later), or a clear error."""
    st = require("sentence_transformers", "colbert", purpose)
    if not hasattr(st, "MultiVectorEncoder"):
        raise MissingDependency(
            f"{purpose} needs sentence-transformers >= 6 (its MultiVectorEncoder); "
            f"{st.__version__} is installed: pip install 'uibk-embedding[colbert]'")
    return st


def _foreign_code_error(folder: Path, classes: list[str], e: Exception) -> Exception:
    """The error for a folder whose own module code does not run under sentence-transformers 6."""
    import sentence_transformers

    what = (f"imports {e.name!r}, which is not installed" if isinstance(e, ModuleNotFoundError)
            else f"fails under sentence-transformers {sentence_transformers.__version__} "
                 f"({type(e).__name__}: {e})")
    msg = (f"{folder}: its own module code ({', '.join(classes)}) {what}. Multi-vector folders load "
           "through sentence-transformers 6 (MultiVectorEncoder), without PyLate: custom modules "
           "written against PyLate (a PyLate Dense) or sentence-transformers 5 (its Transformer) "
           "need PyLate's own environment; re-export a model of ours with "
           "save_sentence_transformers(encoder, FOLDER)")
    return ImportError(msg) if isinstance(e, ImportError) else RuntimeError(msg)


def load_multi_vector_model(folder: str | os.PathLike, *, trust_remote_code: bool = False,
                            device: str = "cpu", options: dict[str, Any] | None = None) -> Any:
    """A ``sentence_transformers.MultiVectorEncoder`` for a local model folder, after the trust
    check (:func:`~uibk_embedding.encoder.trust.require_trust`). A PyLate folder that
    :func:`save_pylate` wrote runs this package's sentence-transformers 6 modules over its files
    (its own modules need PyLate); any other folder -- a native ``MultiVectorEncoder`` save, a
    PyLate ColBERT model, a Stanford ColBERT checkpoint, an export of
    :func:`save_sentence_transformers` -- is ``MultiVectorEncoder(folder, ...)`` itself.

    ``options`` go to ``MultiVectorEncoder`` (``model_kwargs``, ...); ``query_length``,
    ``document_length`` and ``query_expansion`` (PyLate's knobs) set the Transformer module's.

    >>> load_multi_vector_model("/no/such/folder")
    Traceback (most recent call last):
    ...
    FileNotFoundError: multi-vector model folder /no/such/folder does not exist
    """
    p = Path(folder)
    if not p.is_dir():
        raise FileNotFoundError(f"multi-vector model folder {p} does not exist")
    trust = trust_remote_code is True
    require_trust(p, trust, what="a multi-vector model")
    opts = dict(options or {})
    check_loader_options(opts, trust)
    st = _sentence_transformers_6("loading a multi-vector (ColBERT / PyLate) model")
    knobs = {k: opts.pop(k) for k in ("query_length", "document_length", "query_expansion") if k in opts}
    ours = _our_pylate_export(p)
    with quiet_transformers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if ours is not None:
            from uibk_embedding.encoder.pylate_modules import tagged_modules

            model = st.MultiVectorEncoder(modules=list(_modules_of_pylate_export(p, ours, tagged_modules)),
                                          device=device, **opts)
        else:
            classes, _ = custom_code(p)
            try:
                model = st.MultiVectorEncoder(str(p), device=device, local_files_only=True,
                                              trust_remote_code=trust, **opts)
            except (ImportError, AttributeError, TypeError) as e:
                if not classes:  # no code of the folder's own ran: the library's error as it is
                    raise
                raise _foreign_code_error(p, classes, e) from e
    first = model[0]
    for k, v in knobs.items():
        if not hasattr(first, k):
            raise ValueError(f"{p}: its first module ({type(first).__name__}) has no {k!r} to set")
        setattr(first, k, v)
    return model.eval()


def _modules_of_pylate_export(folder: Path, cfg: dict[str, Any], tm: Any) -> tuple[Any, Any]:
    """:class:`tagged_modules.TaggedInput` and ``TaggedLists`` over the files of a PyLate folder
    written by :func:`save_pylate` (its ``branched_transformer.json``, ``1_HybridTokens``)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    branched = json.loads((folder / "branched_transformer.json").read_text())
    hybrid_dir = folder / str(_modules(folder)[1].get("path", ""))
    hybrid = json.loads((hybrid_dir / "config.json").read_text())
    proj = load_file(str(hybrid_dir / "projections.safetensors"))
    tok = AutoTokenizer.from_pretrained(str(folder))
    layout = branched["architecture"]
    if layout == "uibk":
        word = str((cfg.get("prompts") or {}).get("query", "")).strip()
        uibk = {**branched.get("uibk", {}), "cls": tok.cls_token, "sep": tok.sep_token, "pad": tok.pad_token,
                "query_marker": cfg["query_prefix"], "document_marker": cfg["document_prefix"],
                "prompt_word": word}
        lengths = (int(cfg["query_length"]), int(cfg["document_length"]))
        facts: dict[str, Any] = {}
    else:
        uibk = {}
        lengths = (int(cfg["query_length"]) - 1, int(cfg["document_length"]) - 1)  # less PyLate's marker
        facts = {"pad_token_id": int(tok.pad_token_id or 0),
                 "truncation_side": str(getattr(tok, "truncation_side", "right")),
                 "takes_token_types": "token_type_ids" in tok.model_input_names,
                 "pad_token_type_id": int(getattr(tok, "pad_token_type_id", 0) or 0)}
    first = tm.TaggedInput(str(folder), layout=layout, query_length=lengths[0], document_length=lengths[1],
                           uibk=uibk, pooling=branched.get("pooling"), tokenizer_facts=facts,
                           do_lower_case=bool(branched.get("do_lower_case")))
    second = tm.TaggedLists(R=proj["R"], P=proj["P"], beta=hybrid["beta"], lambda_=hybrid["lambda_"],
                            query_token_cap=hybrid["query_token_cap"])
    return first, second


def task_prompts(prompts: dict[str, str], default: str | None) -> dict[bool, str]:
    """The prompt of queries (``True``) and documents (``False``) as ``MultiVectorEncoder``'s
    ``encode_query`` / ``encode_document`` choose it: the ``"query"`` prompt; the first of
    ``"document"``, ``"passage"``, ``"corpus"``; else the default prompt (a prompt declared
    empty stays empty).

    >>> task_prompts({"query": "[Q] ", "passage": "[D] "}, None)
    {True: '[Q] ', False: '[D] '}
    >>> task_prompts({"query": ""}, "x: ")
    {True: '', False: 'x: '}
    """
    doc = next((n for n in _DOC_PROMPTS if n in prompts), None)
    return {True: (prompts["query"] if "query" in prompts else default) or "",
            False: (prompts[doc] if doc else default) or ""}


def _limits(module: Any) -> tuple[int | None, int | None]:
    """The tokens a sentence-transformers ``Transformer`` reads of a query and of a document
    (special tokens included), None where it does not say."""
    seq = getattr(module, "max_seq_length", None)
    q, d = getattr(module, "query_length", None) or seq, getattr(module, "document_length", None) or seq
    exp = getattr(module, "query_expansion", None)
    if isinstance(exp, dict) and exp.get("length"):
        q = int(exp["length"]) if exp.get("strategy") == "fixed" else max(int(q or 0), int(exp["length"]))
    return (int(q) if q else None), (int(d) if d else None)


class PyLateEncoder(TaggedEncoder):
    """A multi-vector model folder whose ``MultiVectorEncoder.encode_query`` / ``encode_document``
    return tagged lists, as an encoder: a sentence-transformers 6 folder written by
    :func:`save_sentence_transformers`, a PyLate folder written by :func:`save_pylate`, or a
    released UIBK model (PyLate's format, custom modules: see docs/loading.md for what loads).

    Runs sentence-transformers 6's ``MultiVectorEncoder`` (:func:`load_multi_vector_model`): its
    prompts, ``preprocess`` (lengths, markers) and modules, batched by our pipeline (a background
    tokeniser, batches by a token budget, one copy to the host per batch). PyLate itself is not
    needed.

    Parameters
    ----------
    folder: the model folder (``modules.json``, ``config_sentence_transformers.json``, ...).
    trust_remote_code: allow the folder's own code to run (required when ``modules.json`` names
        classes that are not the exact installed sentence-transformers / PyLate ones, or a
        configuration has an ``auto_map``: :func:`~uibk_embedding.encoder.trust.code_risks`).
    device: ``"cuda"``, ``"cpu"``, ... (default: CUDA when present, else CPU).
    dtype: ``"bfloat16"`` or ``"float32"`` (default: bfloat16 on CUDA, float32 otherwise).
    num_threads: CPU threads for torch; None leaves it alone.
    dense_weight: default query-time dense weight (default: what the export recorded, else 1).
    colbert_options: options for ``MultiVectorEncoder`` (``model_kwargs``, ...) and the
        Transformer module's ``query_length`` / ``document_length`` / ``query_expansion``.
    format: if given, must have the constants the probe reads.
    **kwargs: ``batch_tokens``, ``show_progress``, ``prefetch`` (see
        :class:`~uibk_embedding.encoder.base.TaggedEncoder`).

    Prompts: the model's ``query`` prompt for queries and ``document`` (or ``passage`` /
    ``corpus``) prompt for documents when it declares them, else its default prompt.

    >>> import tempfile
    >>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
    >>> cfg = UIBKConfig.tiny()
    >>> native = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["lift of a wing"]), device="cpu")
    >>> folder = save_sentence_transformers(native, tempfile.mkdtemp())
    >>> enc = PyLateEncoder(folder, trust_remote_code=True, device="cpu")
    >>> enc.format.beta, enc.format.lambda_, enc.format.projection.startswith("pylate-")
    (0.9, 0.75, True)
    >>> d = enc.encode_documents(["lift of a wing"])[0]
    >>> bool(np.abs(d - native.encode_documents(["lift of a wing"])[0]).max() < 1e-5)
    True
    >>> PyLateEncoder(folder)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.UntrustedCode: ... runs its own code when it loads: modules.json names ...
    """

    kind = "pylate"

    def __init__(self, folder: str | os.PathLike, *, trust_remote_code: bool = False,
                 device: str | None = None, dtype: str | None = None, num_threads: int | None = None,
                 dense_weight: float | None = None, colbert_options: dict[str, Any] | None = None,
                 format: TaggedFormat | None = None, name: str | None = None, **kwargs: Any) -> None:
        self.folder = Path(folder).resolve()
        if not is_pylate_folder(self.folder):
            raise ValueError(f"{self.folder} is not a multi-vector model folder ({MODULES_NAME} and a "
                             f"{ST_CONFIG_NAME} written by sentence-transformers 6 or PyLate)")
        require_trust(self.folder, trust_remote_code, what="a PyLate model")
        import torch

        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.device = resolve_device(device)
        self.dtype = dtype = resolve_dtype(self.device, dtype)
        self.trust_remote_code = trust_remote_code is True
        self.colbert_options = dict(colbert_options or {})
        self.colbert = load_multi_vector_model(self.folder, trust_remote_code=self.trust_remote_code,
                                               device=self.device, options=self.colbert_options)
        if dtype == "bfloat16":
            self.colbert.to(torch.bfloat16)
        self.model_name = name or str(folder)
        mve = self.colbert
        prompts = dict(mve.prompts or {})
        default = prompts.get(mve.default_prompt_name or "", None)
        self.prompts = task_prompts(prompts, default)
        self._tok_lock = threading.Lock()
        ours = json.loads((self.folder / ST_CONFIG_NAME).read_text()).get(OUR_BLOCK, {})
        if dense_weight is None:
            dense_weight = float(ours.get("dense_weight", 1.0))
        self._probed = False
        kwargs.setdefault("batch_tokens", 8192 if self.device == "cpu" else 65536)
        # the cap the model's tagged construction applies, which a server reports
        cap = next((int(m.query_token_cap) for m in mve if hasattr(m, "query_token_cap")), None)
        if cap is not None:
            kwargs.setdefault("query_token_cap", cap)
        first = mve[0]
        self._limit = dict(zip((True, False), _limits(first), strict=True))
        eye = {"R": np.eye(N_SLOTS * BODY, dtype=np.float32), "P": np.eye(BODY, dtype=np.float32)}
        model_max = int(getattr(first, "max_seq_length", None) or 2048)
        super().__init__(N_SLOTS * BODY, BODY, projections=eye, dense_weight=dense_weight,
                         query_max_length=max(2, self._limit[True] or model_max),
                         doc_max_length=max(2, self._limit[False] or model_max), **kwargs)
        with warnings.catch_warnings():  # a probe text longer than the model reads is no news
            warnings.simplefilter("ignore")
            queries = self.encode_queries(list(PROBE_QUERIES), dense_weight=1.0, show_progress=False)
            documents = self.encode_documents(list(PROBE_DOCUMENTS), show_progress=False)
        names = [str(m["type"]).rsplit(".", 1)[-1] for m in _modules(self.folder)]
        fmt, self.probe = probe_format(queries, documents,
                                       what=f"{self.folder} (modules.json lists the modules {names})")
        if format is not None and (format.beta, format.lambda_) != (fmt.beta, fmt.lambda_):
            raise ValueError(f"{self.folder}: its lists have beta={fmt.beta}, lambda={fmt.lambda_}, "
                             f"not the requested beta={format.beta}, lambda={format.lambda_}")
        self.format = replace(self.format, beta=fmt.beta, lambda_=fmt.lambda_,  # pooling kept (docs only)
                              projection=f"pylate-{model_hash(self.folder)}")
        self._probed = True

    # -- what does not apply: the model holds its own projections ----------------------------
    def _declare_projection(self) -> None:
        """The format's projection is the model's content hash, set after the probe."""

    def fit_projection(self, *args: Any, **kwargs: Any) -> TaggedEncoder:
        raise NotImplementedError("a PyLate model applies its own fixed projections; they cannot be "
                                  "refitted from here")

    def set_projections(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("a PyLate model applies its own fixed projections")

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": str(self.folder), "format": self.format.to_dict(),
                "projection": self.format.projection, "dense_weight": self.dense_weight,
                "dtype": self.dtype, "query_length": self._limit[True],
                "document_length": self._limit[False],
                "colbert_options": self.colbert_options, "prompts": [self.prompts[True], self.prompts[False]]}

    def save_projections(self, path: str | os.PathLike) -> None:
        raise NotImplementedError(f"a PyLate model is its folder: use {self.folder} itself")

    # -- the pipeline's hooks ------------------------------------------------------------------
    def _tokenize(self, texts: list[str], is_query: bool) -> TokenBatch:
        import torch

        prompt = self.prompts[is_query]
        task = "query" if is_query else "document"
        with self._tok_lock:
            feats = self.colbert.preprocess(texts, prompt=prompt or None, task=task)
        reported = feats.pop("truncated", None)
        inputs = {k: v for k, v in feats.items() if isinstance(v, torch.Tensor)}
        zero = np.zeros(len(texts), dtype=np.int64)
        cut = (reported.numpy().astype(bool) if isinstance(reported, torch.Tensor)
               else self._truncated([prompt + t for t in texts] if prompt else texts, is_query))
        tb = TokenBatch(inputs, starts=zero, ends=zero, truncated=cut)
        tb.is_query = is_query  # type: ignore[attr-defined]
        tb.extra = {k: v for k, v in feats.items() if not isinstance(v, torch.Tensor)}  # type: ignore[attr-defined]
        return tb

    def _row_token_ids(self, tb: TokenBatch) -> list[np.ndarray] | None:
        """The ids of each text's own positions (the ``text_mask`` our exported modules give):
        the token rows they emit, in order; ``None`` for a folder without one."""
        mask = tb.inputs.get("text_mask")
        if mask is None:
            return None
        ids, keep = tb.inputs["input_ids"].numpy(), mask.numpy().astype(bool)
        return [ids[i][keep[i]].astype(np.int64) for i in range(len(ids))]

    def _vocabulary_tokenizer(self) -> Any:
        return getattr(self.colbert, "tokenizer", None)

    def _truncated(self, texts: list[str], is_query: bool) -> np.ndarray:
        """Which texts the model cut: their full token count (special tokens included) over what
        the model reads."""
        limit = self._limit[is_query]
        tok = getattr(self.colbert, "tokenizer", None)
        if limit is None or tok is None or not callable(tok):
            return np.zeros(len(texts), dtype=bool)
        enc = tok(texts, add_special_tokens=True, truncation=False, verbose=False)
        return np.array([len(x) > limit for x in enc["input_ids"]], dtype=bool)

    def _prepare(self, tb: TokenBatch, is_query: bool) -> TokenBatch:
        tb.truncated = np.asarray(tb.truncated, dtype=bool)
        if self._is_cuda():
            tb.inputs = {k: v.pin_memory() for k, v in tb.inputs.items()}
        return tb

    def _launch(self, tb: TokenBatch, w: float | np.ndarray) -> Pending:
        """The model's forward (its modules, ``task`` given), the rows its ``attention_mask``
        keeps (``MultiVectorEncoder.encode``), normalised, query slots scaled by the dense weight."""
        import torch

        is_query = bool(tb.is_query)  # type: ignore[attr-defined]
        task = "query" if is_query else "document"
        extra = dict(getattr(tb, "extra", {}))
        with self._lock, torch.inference_mode():
            feats = self._to_device(tb.inputs)
            # query expansion: the [MASK] rows past the text are scored, keep the batch's width
            expanded = is_query and "query_expansion_positions" in feats

            def run(x: dict[str, Any]) -> tuple[Any, Any]:  # the kept rows, packed, and their counts
                o = self.colbert({**x, **extra}, task=task)
                keep = o["attention_mask"].bool()
                return o["token_embeddings"][keep], keep.sum(1)

            packed, kept = self._in_budget(feats, run, (False, False), crop=not expanded)
            rows = torch.nn.functional.normalize(packed.float(), p=2, dim=1)
            counts = kept.cpu().numpy().astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(counts)])
            if rows.shape[-1] != DIM and self._probed:
                raise ValueError(f"{self.folder}: gave {rows.shape[-1]}-d vectors")
            weights = np.broadcast_to(np.asarray(w, dtype=np.float64), counts.shape)
            if np.any(weights != 1.0) and rows.shape[0]:
                n = np.minimum(counts, N_SLOTS)
                first = np.repeat(offsets[:-1], n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
                idx = torch.from_numpy(first).to(rows.device)
                rows[idx] = apply_dense_weight(rows[idx], np.repeat(weights, n))
            host, event = to_host(rows)
        return Pending(tb, host, event, offsets)


# -- saving our encoders as PyLate models ----------------------------------------------------------
def _hf_tokenizer_uibk(enc: Any) -> Any:
    """The UIBK encoder's ``tokenizers`` tokenizer as a transformers fast tokenizer that adds
    ``[CLS] ... [SEP]`` (PyLate tokenises with special tokens and inserts its marker after [CLS])."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(enc.tokenizer.to_str())
    ids = enc._ids
    cls_t, sep_t = tok.id_to_token(ids["cls_token_id"]), tok.id_to_token(ids["sep_token_id"])
    pad_t = tok.id_to_token(ids["pad_token_id"])
    tok.post_processor = TemplateProcessing(single=f"{cls_t} $A {sep_t}",
                                            pair=f"{cls_t} $A {sep_t} $B {sep_t}",
                                            special_tokens=[(cls_t, ids["cls_token_id"]),
                                                            (sep_t, ids["sep_token_id"])])
    mask_t = "[MASK]" if tok.token_to_id("[MASK]") is not None else None
    unk_t = "[UNK]" if tok.token_to_id("[UNK]") is not None else None
    return PreTrainedTokenizerFast(tokenizer_object=tok, cls_token=cls_t, sep_token=sep_t,
                                   pad_token=pad_t, mask_token=mask_t, unk_token=unk_t,
                                   model_max_length=int(enc.model_max_length))


def save_pylate(encoder: TaggedEncoder, folder: str | os.PathLike) -> Path:
    """Write ``encoder`` as a PyLate ColBERT model folder with custom modules and return it.

    ``pylate.models.ColBERT(folder, trust_remote_code=True).encode(texts, is_query=...)`` then
    returns the encoder's own tagged lists (query slots at dense weight 1: scale them for
    another), and ``load_encoder(folder, trust_remote_code=True)`` loads it back. For the UIBK
    architecture (:class:`~uibk_embedding.encoder.uibk.UIBKEncoder`) and one-model encoders
    (:class:`~uibk_embedding.encoder.transformer.TransformerEncoder`, the embedded default);
    a composed encoder runs two models and is refused. Weights are saved in float32.

    Writing needs no PyLate. The folder's modules are written against PyLate 1.6 and
    sentence-transformers 5.3, which PyLate pins: run it in PyLate's own environment
    (benchmarks/pylate_interop.py names it); here, ``load_encoder`` reads its files with the
    sentence-transformers 6 modules of :func:`save_sentence_transformers`, and
    ``tests/test_pylate_model.py`` checks it in PyLate where PyLate is installed.

    >>> import tempfile
    >>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
    >>> cfg = UIBKConfig.tiny()
    >>> native = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["lift of a wing"]), device="cpu")
    >>> folder = save_pylate(native, tempfile.mkdtemp())
    >>> sorted(p.name for p in folder.glob("*.py"))
    ['branched_transformer.py', 'hybrid_tokens.py', 'sentence_pooling.py', 'uibk_architecture.py']
    """
    import torch
    from safetensors.torch import save_file

    if isinstance(encoder, PyLateEncoder):
        raise ValueError(f"this encoder is already the PyLate model folder {encoder.folder}: copy it")
    if not isinstance(encoder, UIBKEncoder | TransformerEncoder):
        raise NotImplementedError(
            f"a {type(encoder).__name__} cannot be saved as one PyLate model: only the UIBK "
            "architecture and one-model encoders (the embedded default, a Hugging Face folder) make "
            "both heads in one model; a composed encoder runs two models (two forward passes), so "
            "save it with .save(FOLDER) and load it with load_encoder(FOLDER)")
    if isinstance(encoder, TransformerEncoder):
        # the PyLate module reads a text's tokens at 1 .. n - 2 (BERT's [CLS] ... [SEP]); the
        # native encoder takes them from the tokenizer's special-tokens mask, so another template
        # would export lists that differ from the native ones
        probe = encoder._tokenize(["lift of a wing"], False)
        n = int(probe.inputs["attention_mask"].sum())
        if (int(probe.starts[0]), int(probe.ends[0])) != (1, n - 1):
            raise NotImplementedError(
                "this model's tokenizer does not wrap a text in one special token at each end "
                "([CLS] ... [SEP]), which the PyLate export reads its tokens by: use the model "
                "through load_encoder(FOLDER), not as a PyLate folder")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    fmt = encoder.format
    if isinstance(encoder, UIBKEncoder):
        layout = "uibk"
        cfg = encoder.uibk_config
        bc = cfg.backbone_config()
        bc.save_pretrained(str(out))
        state = {k: v.detach().float().cpu().contiguous() for k, v in encoder.model.state_dict().items()}
        save_file(state, str(out / "model.safetensors"))
        tok = _hf_tokenizer_uibk(encoder)
        tok.save_pretrained(str(out))
        branched = {"architecture": "uibk", "max_seq_length": encoder.doc_max_length,
                    "uibk": {k: getattr(cfg, k) for k in ("top_layers", "num_latents", "latent_heads",
                                                          "ff_mult", "token_dim")},
                    "pooling": None, "strip_marker": False, "do_lower_case": False}
        markers = (cfg.query_marker, cfg.document_marker)
        prompt = f"{cfg.prompt_word} "
        prompts, default_prompt = {"query": prompt, "document": prompt}, "query"
        lengths = (encoder.query_max_length, encoder.doc_max_length)
        token_dim = cfg.token_dim
    else:
        layout = "transformer"

        with quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            encoder.model.save_pretrained(str(out), safe_serialization=True)
        import copy

        tok = copy.deepcopy(encoder.tokenizer)
        # the markers only tell a query from a document (the model never reads them): BERT's
        # unused entries where it has them, else two added tokens
        unused = ("[unused0]", "[unused1]")
        if all(tok.convert_tokens_to_ids(t) not in (None, tok.unk_token_id) for t in unused):
            markers = unused
        else:
            markers = ("[Q]", "[D]")
            tok.add_tokens(list(markers), special_tokens=True)
        tok.save_pretrained(str(out))
        branched = {"architecture": "transformer", "max_seq_length": encoder.doc_max_length,
                    "uibk": {}, "pooling": {"modes": list(encoder.pooling.modes),
                                            "normalize": bool(encoder.pooling.normalize)},
                    "strip_marker": True, "do_lower_case": bool(encoder.do_lower_case)}
        prompts, default_prompt = {"query": "", "document": ""}, None
        lengths = (encoder.query_max_length + 1, encoder.doc_max_length + 1)  # + the marker
        token_dim = int(encoder.model.config.hidden_size)
    (out / "branched_transformer.json").write_text(json.dumps(branched, indent=2))
    for name in pylate_modules.FILES:
        shutil.copyfile(pylate_modules.FOLDER / name, out / name)
    # the second module (hybrid_tokens.HybridTokens, as its save writes it): R, R' and the
    # tagged construction; written here so that saving needs no PyLate (only loading it in PyLate)
    qid = tok.convert_tokens_to_ids(markers[0]) if layout == "transformer" else encoder._ids["query_marker"]
    R = torch.from_numpy(np.asarray(encoder.R, dtype=np.float32)).contiguous()
    P = torch.from_numpy(np.asarray(encoder.P, dtype=np.float32)).contiguous()
    hybrid = out / "1_HybridTokens"
    hybrid.mkdir(exist_ok=True)
    (hybrid / "config.json").write_text(json.dumps(
        {"in_features": int(token_dim), "out_features": DIM, "beta": fmt.beta, "lambda_": fmt.lambda_,
         "layout": layout, "query_marker_id": int(qid), "query_token_cap": int(encoder.query_token_cap)},
        indent=2))
    save_file({"linear.weight": torch.cat([torch.zeros(1, P.shape[1]), P]).contiguous()},
              str(hybrid / "model.safetensors"))
    save_file({"R": R, "P": P}, str(hybrid / "projections.safetensors"))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "branched_transformer.BranchedTransformer"},
               {"idx": 1, "name": "1", "path": "1_HybridTokens", "type": "hybrid_tokens.HybridTokens"}]
    (out / MODULES_NAME).write_text(json.dumps(modules, indent=2))
    import transformers

    versions = {"transformers": transformers.__version__, "pytorch": torch.__version__}
    for package in ("sentence_transformers", "pylate"):
        try:
            versions[package] = __import__(package).__version__
        except (ImportError, AttributeError):
            pass
    st_config = {
        "model_type": "ColBERT",
        "__version__": versions,
        "prompts": prompts, "default_prompt_name": default_prompt, "similarity_fn_name": "MaxSim",
        "query_prefix": markers[0], "document_prefix": markers[1],
        "query_length": int(lengths[0]), "document_length": int(lengths[1]),
        # every token is kept (the tagged list decides the rows), no [MASK] expansion
        "attend_to_expansion_tokens": False, "skiplist_words": [], "do_query_expansion": False,
        OUR_BLOCK: {"format": fmt.to_dict(), "source_projection": fmt.projection,
                    "source": getattr(encoder, "model_name", type(encoder).__name__),
                    "dense_weight": encoder.dense_weight, "layout": layout},
    }
    (out / ST_CONFIG_NAME).write_text(json.dumps(st_config, indent=2))
    return out


# -- saving our encoders as sentence-transformers 6 models -------------------------------------
#: the files of a sentence-transformers 6 export, copied from pylate_modules/
ST_FILES = ("uibk_architecture.py", "sentence_pooling.py", "tagged_modules.py")


def save_sentence_transformers(encoder: TaggedEncoder, folder: str | os.PathLike) -> Path:
    """Write ``encoder`` as a sentence-transformers 6 ``MultiVectorEncoder`` folder (custom
    modules: ``tagged_modules.py``) and return it.

    ``sentence_transformers.MultiVectorEncoder(folder, trust_remote_code=True)`` then gives, from
    ``encode_query`` / ``encode_document``, the encoder's own tagged lists (query slots at dense
    weight 1: scale them for another), and ``load_encoder(folder, trust_remote_code=True)`` loads
    it back. For the UIBK architecture (:class:`~uibk_embedding.encoder.uibk.UIBKEncoder`),
    one-model encoders (:class:`~uibk_embedding.encoder.transformer.TransformerEncoder`, the
    embedded default, with a fast tokenizer; weights saved in float32) and composed encoders
    (:class:`~uibk_embedding.encoder.composed.ComposedEncoder`, ``load_encoder(dense=...,
    tokens=...)``: both model folders are copied unchanged into ``dense/`` and ``tokens/``, after
    checking they still hash to what the encoder loaded, and the first module,
    ``ComposedInput``, runs both models -- two forward passes -- with the encoder's prompts and
    lengths; its ``colbert_options`` other than ``query_length`` / ``document_length`` /
    ``query_expansion`` are refused). Needs only the files of this package and torch to write
    (sentence-transformers >= 6 to load).

    >>> import tempfile
    >>> from sentence_transformers import MultiVectorEncoder
    >>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
    >>> cfg = UIBKConfig.tiny()
    >>> native = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["lift of a wing"]), device="cpu")
    >>> folder = save_sentence_transformers(native, tempfile.mkdtemp())
    >>> model = MultiVectorEncoder(str(folder), trust_remote_code=True, device="cpu")
    >>> got = model.encode_document(["lift of a wing"], convert_to_numpy=True)[0]
    >>> bool(np.abs(got - native.encode_documents(["lift of a wing"])[0]).max() < 1e-5)
    True
    """
    import torch
    from safetensors.torch import save_file

    if isinstance(encoder, PyLateEncoder):
        raise ValueError(f"this encoder is already the model folder {encoder.folder}: copy it")
    # a composed encoder (encoder/composed.py, which imports this module) writes its own first module
    write_composed_input = getattr(encoder, "write_st_input", None)
    if not (isinstance(encoder, UIBKEncoder | TransformerEncoder) or callable(write_composed_input)):
        raise NotImplementedError(
            f"a {type(encoder).__name__} cannot be saved as a sentence-transformers model: only the "
            "UIBK architecture, one-model encoders (the embedded default, a Hugging Face folder) and "
            "composed encoders (load_encoder(dense=..., tokens=...)) are")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    fmt = encoder.format
    if callable(write_composed_input):
        layout = "composed"
        first_type = "tagged_modules.ComposedInput"
        first = write_composed_input(out)
        token_dim = int(encoder.P.shape[1])
    elif isinstance(encoder, UIBKEncoder):
        layout = "uibk"
        cfg = encoder.uibk_config
        cfg.backbone_config().save_pretrained(str(out))
        state = {k: v.detach().float().cpu().contiguous() for k, v in encoder.model.state_dict().items()}
        save_file(state, str(out / "model.safetensors"))
        encoder.tokenizer.save(str(out / "tokenizer.json"))
        tok = encoder.tokenizer
        ids = encoder._ids
        uibk = {**{k: getattr(cfg, k) for k in ("top_layers", "num_latents", "latent_heads", "ff_mult",
                                                 "token_dim")},
                "cls": tok.id_to_token(ids["cls_token_id"]), "sep": tok.id_to_token(ids["sep_token_id"]),
                "pad": tok.id_to_token(ids["pad_token_id"]), "query_marker": cfg.query_marker,
                "document_marker": cfg.document_marker, "prompt_word": cfg.prompt_word}
        first = {"layout": layout, "query_length": encoder.query_max_length,
                 "document_length": encoder.doc_max_length, "uibk": uibk, "pooling": None,
                 "tokenizer_facts": {}, "do_lower_case": False}
        token_dim = cfg.token_dim
    else:
        layout = "transformer"
        base = encoder._base_tokenizer
        if base is None and not getattr(encoder.tokenizer, "is_fast", False):
            raise NotImplementedError("this model has no fast (tokenizers) tokenizer, which the "
                                      "sentence-transformers export tokenises with: use it through "
                                      "load_encoder(FOLDER)")
        with quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            encoder.model.save_pretrained(str(out), safe_serialization=True)
        from tokenizers import Tokenizer

        text = base.to_str() if base is not None else encoder.tokenizer.backend_tokenizer.to_str()
        Tokenizer.from_str(text).save(str(out / "tokenizer.json"))
        facts = encoder._facts
        first = {"layout": layout, "query_length": encoder.query_max_length,
                 "document_length": encoder.doc_max_length, "uibk": {},
                 "pooling": {"modes": list(encoder.pooling.modes),
                             "normalize": bool(encoder.pooling.normalize)},
                 "tokenizer_facts": {"pad_token_id": int(facts.pad_token_id),
                                     "truncation_side": str(facts.truncation_side),
                                     "takes_token_types": bool(facts.takes_token_types),
                                     "pad_token_type_id": int(facts.pad_token_type_id)},
                 "do_lower_case": bool(encoder.do_lower_case)}
        token_dim = int(encoder.model.config.hidden_size)
    if layout != "composed":
        first_type = "tagged_modules.TaggedInput"
        (out / "tagged_input.json").write_text(json.dumps(first, indent=2))
    for name in ST_FILES:
        shutil.copyfile(pylate_modules.FOLDER / name, out / name)
    lists = out / "1_TaggedLists"
    lists.mkdir(exist_ok=True)
    R = np.asarray(encoder.R, dtype=np.float32)
    P = np.asarray(encoder.P, dtype=np.float32)
    if P.shape != (BODY, token_dim):
        raise ValueError(f"the token projection is {P.shape}, expected ({BODY}, {token_dim})")
    (lists / "config.json").write_text(json.dumps(
        {"beta": fmt.beta, "lambda_": fmt.lambda_, "query_token_cap": int(encoder.query_token_cap)},
        indent=2))
    save_file({"R": torch.from_numpy(R).contiguous(), "P": torch.from_numpy(P).contiguous()},
              str(lists / "projections.safetensors"))
    modules = [{"idx": 0, "name": "0", "path": "", "type": first_type},
               {"idx": 1, "name": "1", "path": "1_TaggedLists", "type": "tagged_modules.TaggedLists"}]
    (out / MODULES_NAME).write_text(json.dumps(modules, indent=2))
    import transformers

    versions = {"transformers": transformers.__version__, "pytorch": torch.__version__}
    try:
        import sentence_transformers

        versions["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        pass
    st_config = {
        "model_type": "MultiVectorEncoder", "__version__": versions,
        # the prompts and markers are the first module's (it tokenises as the native encoder)
        "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "maxsim",
        OUR_BLOCK: {"format": fmt.to_dict(), "source_projection": fmt.projection,
                    "source": getattr(encoder, "model_name", type(encoder).__name__),
                    "dense_weight": encoder.dense_weight, "layout": layout},
    }
    (out / ST_CONFIG_NAME).write_text(json.dumps(st_config, indent=2))
    return out


__all__ = ["ProbeReport", "PyLateEncoder", "custom_code", "is_pylate_folder", "load_multi_vector_model",
           "model_hash", "probe_format", "save_pylate", "save_sentence_transformers", "task_prompts"]
