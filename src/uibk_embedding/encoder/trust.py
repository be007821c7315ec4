"""Would loading a model folder run Python code from the folder? Asked before anything loads.

sentence-transformers, PyLate and transformers import code from a *local* model folder by
several routes, some of them even with ``trust_remote_code=False``:

* a ``modules.json`` ``type`` that does not start with ``sentence_transformers.`` is first
  looked up as ``FILE.Class`` in the folder: ``pylate.Dense`` imports the folder's
  ``pylate.py``, ``evil.Transformer`` its ``evil.py``; ``owner/repo--file.Class`` names a Hub
  repository's file;
* an ``auto_map`` in ``config.json``, ``tokenizer_config.json`` (or any other configuration
  file transformers reads) names classes in the folder's ``*.py`` files;
* a Dense module's ``activation_function`` is imported by its dotted name;
* a ``pylate.py`` / ``sentence_transformers.py`` (or such a package folder) beside the model
  shadows the installed package wherever the folder lands on ``sys.path``.

:func:`code_risks` lists every such reason for one folder (its root and the folder of each
module ``modules.json`` lists); :func:`require_trust` raises
:class:`~uibk_embedding.errors.UntrustedCode` naming them unless ``trust_remote_code=True``.
Every loading route of this package that could import a folder's code (``load_encoder(folder)``,
``load_encoder(dense=..., tokens=...)``, ``check_colbert_folder``, the PyLate loader, and through
``load_encoder`` the CLI, ``serve`` and the Ray actors) calls it first, and then calls the
libraries with ``trust_remote_code=False`` too. The allowed module types are exact class paths of
installed packages (:data:`LIBRARY_MODULES`).

>>> import json, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "modules.json").write_text(json.dumps([
...     {"type": "sentence_transformers.models.Transformer", "path": ""},
...     {"type": "pylate.Dense", "path": "1_Dense"}]))
>>> code_risks(d)  # doctest: +ELLIPSIS
["modules.json names the module type 'pylate.Dense', ...]
>>> require_trust(d, trust_remote_code=True)  # the caller read the code: nothing is checked
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from uibk_embedding.errors import UntrustedCode

#: sentence-transformers 6's module classes, by the path its ``save_pretrained`` writes
_ST6_MODULES = {
    "sentence_transformers.base.modules.transformer": "Transformer",
    "sentence_transformers.base.modules.dense": "Dense",
    "sentence_transformers.base.modules.normalize": "Normalize",
    "sentence_transformers.sentence_transformer.modules.pooling": "Pooling",
    "sentence_transformers.sentence_transformer.modules.layer_norm": "LayerNorm",
    "sentence_transformers.sentence_transformer.modules.dropout": "Dropout",
    "sentence_transformers.sentence_transformer.modules.weighted_layer_pooling": "WeightedLayerPooling",
    "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask": "MultiVectorMask",
}
#: the module types a folder may name without running its own code: exact class paths of the
#: installed sentence-transformers (5: the module path; 6: the module path + class, or the
#: package that exports it) and PyLate (sentence-transformers 6 reads ``pylate.models.Dense.Dense``
#: as its own Dense, without importing PyLate)
LIBRARY_MODULES = frozenset({
    *(f"sentence_transformers.models.{name}{suffix}"
      for name in ("Transformer", "Pooling", "Normalize", "Dense", "LayerNorm", "Dropout",
                   "WeightedLayerPooling")
      for suffix in ("", f".{name}")),
    *(f"{path}.{name}" for path, name in _ST6_MODULES.items()),
    *(f"sentence_transformers.base.modules.{n}" for n in ("Transformer", "Dense", "Normalize")),
    *(f"sentence_transformers.sentence_transformer.modules.{n}"
      for n in ("Pooling", "LayerNorm", "Dropout", "WeightedLayerPooling")),
    "sentence_transformers.multi_vector_encoder.modules.MultiVectorMask",
    "pylate.models.Dense.Dense",
})
#: modules whose ``config.json`` names an ``activation_function`` that is imported by name
_DENSE = frozenset({"sentence_transformers.models.Dense", "sentence_transformers.models.Dense.Dense",
                    "sentence_transformers.base.modules.dense.Dense",
                    "sentence_transformers.base.modules.Dense", "pylate.models.Dense.Dense"})
_ACTIVATION_PREFIX = "torch.nn."
#: installed packages a file in the folder must not shadow
_PACKAGES = frozenset({"sentence_transformers", "pylate", "transformers", "torch", "uibk_embedding"})
_MAX_JSON_BYTES = 256 * 2**20  # a bigger configuration is not read and is itself a reason
HINT = "pass trust_remote_code=True if you trust this folder"


def _json_files(folder: Path) -> list[Path]:
    """The JSON files directly in ``folder`` (what the libraries read from a module's folder)."""
    try:
        return sorted(f for f in folder.iterdir() if f.name.endswith(".json") and f.is_file())
    except OSError:
        return []


def _has_key(obj: Any, key: str) -> bool:
    if isinstance(obj, dict):
        return key in obj or any(_has_key(v, key) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_key(v, key) for v in obj)
    return False


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def code_risks(folder: str | os.PathLike) -> list[str]:
    """The reasons loading ``folder`` would import Python code from it (empty: none found).

    Inspects, without importing anything: every ``modules.json`` type against
    :data:`LIBRARY_MODULES`; every JSON file of the folder, of each module's folder and of a
    tokenizer folder a ``sentence_bert_config.json`` names (``tokenizer_name_or_path``) for an
    ``auto_map`` key (at any depth); Dense modules' ``activation_function`` (must be a
    ``torch.nn`` class); ``.py`` files or package folders named after an installed package
    the allowed types come from (``pylate``, ``sentence_transformers``, ...).

    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> code_risks(d)
    []
    >>> _ = (d / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "m.M"}}))
    >>> code_risks(d)
    ["config.json has an 'auto_map' (transformers imports the classes it names from the folder's files)"]
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    reasons: list[str] = []
    dirs = [root]
    modules_file = root / "modules.json"
    if modules_file.is_file():
        try:
            mods = json.loads(modules_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            return [f"modules.json cannot be read ({e}), so what it would import is unknown"]
        if not isinstance(mods, list) or not all(isinstance(m, dict) for m in mods):
            return ["modules.json is not a list of modules, so what it would import is unknown"]
        for m in mods:
            type_ = m.get("type")
            sub = (root / str(m.get("path", "") or "")).resolve()
            if sub not in dirs and sub.is_dir():
                dirs.append(sub)
            if not isinstance(type_, str):
                reasons.append(f"modules.json lists a module without a type name ({m!r})")
                continue
            if type_ not in LIBRARY_MODULES:
                file = type_.split("--")[-1].rsplit(".", 1)[0].replace(".", "/") + ".py"
                where = f" (the folder's {file})" if (root / file).is_file() else ""
                reasons.append(
                    f"modules.json names the module type {type_!r}{where}, which is not one of the "
                    "installed sentence-transformers / PyLate classes loaded without folder code")
            elif type_ in _DENSE:
                cfg_file = sub / "config.json"
                try:
                    act = json.loads(cfg_file.read_text()).get("activation_function")
                except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                    act = None
                if act is not None and not (isinstance(act, str) and act.startswith(_ACTIVATION_PREFIX)):
                    reasons.append(f"{_rel(cfg_file, root)} names the activation_function {act!r}, "
                                   f"which is imported by name and is not a {_ACTIVATION_PREFIX} class")
    for d in list(dirs):  # a Transformer module may read its tokenizer from another folder
        try:
            other = json.loads((d / "sentence_bert_config.json").read_text()).get("tokenizer_name_or_path")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            other = None
        if isinstance(other, str) and Path(other).is_dir() and Path(other).resolve() not in dirs:
            dirs.append(Path(other).resolve())
    for d in dirs:
        for name in sorted(_PACKAGES):
            for cand in (d / f"{name}.py", d / name):
                if cand.exists():
                    reasons.append(f"{_rel(cand, root)} shadows the Python package {name!r} (the "
                                   "folder's file would be imported instead of the installed one)")
    seen: set[Path] = set()
    for d in dirs:
        for f in _json_files(d):
            if f in seen:
                continue
            seen.add(f)
            try:
                if f.stat().st_size > _MAX_JSON_BYTES:
                    reasons.append(f"{_rel(f, root)} is over {_MAX_JSON_BYTES >> 20} MiB and was not "
                                   "checked for an 'auto_map'")
                    continue
                data = json.loads(f.read_bytes())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue  # the libraries cannot read it either
            if _has_key(data, "auto_map"):
                reasons.append(f"{_rel(f, root)} has an 'auto_map' (transformers imports the classes "
                               "it names from the folder's files)")
    return reasons


def require_trust(folder: str | os.PathLike, trust_remote_code: bool = False, *,
                  what: str = "") -> None:
    """Raise :class:`~uibk_embedding.errors.UntrustedCode` when loading ``folder`` would run
    its own Python code (:func:`code_risks`) and ``trust_remote_code`` is not True. ``what``
    names the folder's role in the message (``"the dense model"``).

    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "modules.json").write_text(json.dumps([{"type": "evil.Transformer"}]))
    >>> require_trust(d)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.UntrustedCode: ... runs its own code when it loads: modules.json names ...
    """
    if trust_remote_code is True:
        return
    reasons = code_risks(folder)
    if reasons:
        role = f" ({what})" if what else ""
        raise UntrustedCode(
            f"{Path(folder)}{role} runs its own code when it loads: " + "; ".join(reasons)
            + f". That code runs with your permissions: read it, then {HINT} "
            "(CLI: --trust-remote-code)")


def check_loader_options(options: dict[str, Any] | None, trust_remote_code: bool = False, *,
                         what: str = "colbert_options") -> None:
    """Refuse loader options (``colbert_options``, possibly read from a saved encoder's
    folder) that switch ``trust_remote_code`` on, directly or in ``model_kwargs`` /
    ``tokenizer_kwargs`` / ``config_kwargs``, when the caller did not.

    >>> check_loader_options({"query_length": 32})
    >>> check_loader_options({"model_kwargs": {"trust_remote_code": True}})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.UntrustedCode: colbert_options set trust_remote_code (model_kwargs): ...
    """
    if trust_remote_code is True or not options:
        return
    where = ["trust_remote_code"] if "trust_remote_code" in options else []
    where += [k for k in ("model_kwargs", "tokenizer_kwargs", "config_kwargs")
              if isinstance(options.get(k), dict) and "trust_remote_code" in options[k]]
    if where:
        raise UntrustedCode(f"{what} set trust_remote_code ({', '.join(where)}): only the caller "
                            f"decides that; {HINT}")


# files that say nothing about the model's outputs (a model card) are not hashed
_UNHASHED = {"README.md"}
MAX_MODEL_FILES = 10_000  # a model folder holds tens of files; a folder naming "/" is refused
MAX_MODEL_BYTES = 200 * 2**30


def model_digest(folder: str | os.PathLike) -> str:
    """SHA-256 over a model folder's files (relative path, size and bytes, in path order;
    ``README.md`` and hidden files left out): changes whenever a weight, tokeniser or
    configuration file does.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "config.json").write_text("{}")
    >>> a = model_digest(d); _ = (d / "README.md").write_text("a model card")
    >>> model_digest(d) == a
    True
    >>> _ = (d / "config.json").write_text('{"hidden_size": 8}'); model_digest(d) == a
    False
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"model folder {root} does not exist")
    files: list[Path] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):  # symlinked folders are not followed
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            p = Path(dirpath) / name
            if name.startswith(".") or name in _UNHASHED or not p.is_file():
                continue
            files.append(p)
            total += p.stat().st_size
            if len(files) > MAX_MODEL_FILES or total > MAX_MODEL_BYTES:
                raise ValueError(
                    f"{root} holds more than {MAX_MODEL_FILES} files or {MAX_MODEL_BYTES / 2**30:.0f} GiB: "
                    "not a model folder (give the folder that holds the model's config and weights)")
    return _cached_digest(root, files)


#: a model folder's files are not re-read for their digest when every one keeps the size, times
#: and inode it had when the digest was computed; a file changed less than this long before
#: then could change again within the clock's tick unseen, so such a digest is not kept
_SETTLED_NS = 2 * 10**9


def digest_cache_dir() -> Path:
    """Where :func:`model_digest` keeps the digests of unchanged folders: ``$UIBK_CACHE/digests``
    (default ``~/.cache/uibk_embedding/digests``), beside the evaluation cache.

    >>> digest_cache_dir().name
    'digests'
    """
    return Path(os.environ.get("UIBK_CACHE", Path.home() / ".cache" / "uibk_embedding")) / "digests"


def _cached_digest(root: Path, files: list[Path]) -> str:
    """:func:`digest_files`, remembered under a key made of the folder's path and each file's
    path, size, modification and change times and inode: a file rewritten, replaced or renamed
    gives another key, so the bytes are hashed again (as git's index trusts unchanged stats).
    Reading 90 MB of MiniLM weights took 0.15-0.35 s of every start here. The cache is a
    convenience: when it cannot be read or written the digest is computed as before."""
    import time

    stats = [(p, p.stat()) for p in sorted(files)]
    sig = json.dumps([str(root.resolve())] + [
        [p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
        for p, st in stats])
    entry = digest_cache_dir() / hashlib.sha256(sig.encode()).hexdigest()[:40]
    try:
        known = entry.read_text().strip()
        if len(known) == 64 and all(c in "0123456789abcdef" for c in known):
            return known
    except OSError:
        pass
    digest = digest_files(root, files)
    newest = max((max(st.st_mtime_ns, st.st_ctime_ns) for _, st in stats), default=0)
    if time.time_ns() - newest > _SETTLED_NS:  # a file changed just now: not remembered
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
            tmp.write_text(digest)
            os.replace(tmp, entry)
        except OSError:
            pass
    return digest


def digest_files(root: Path, files: list[Path]) -> str:
    """SHA-256 over ``files`` (each one's path relative to ``root``, size and bytes, in path
    order): the one content hash behind :func:`model_digest` and PyLate's ``model_hash``.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.bin").write_bytes(b"x")
    >>> digest_files(d, [d / "a.bin"]) == digest_files(d, [d / "a.bin"]), len(digest_files(d, []))
    (True, 64)
    """
    h = hashlib.sha256()
    for p in sorted(files):
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0".encode())
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()



__all__ = ["LIBRARY_MODULES", "check_loader_options", "code_risks", "model_digest", "require_trust"]
