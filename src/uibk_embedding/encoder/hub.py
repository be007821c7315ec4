"""Hugging Face Hub ids: a model folder fetched (or found in the cache) by ``huggingface_hub``,
as sentence-transformers and PyLate load them (docs/loading.md, "Hub ids").

:func:`resolve_model` turns what :func:`~uibk_embedding.encoder.load_encoder` is given into a
local folder: an existing path stays as it is; an ``org/name`` that is no local path becomes the
snapshot ``huggingface_hub.snapshot_download`` returns -- from its cache (``HF_HUB_CACHE``,
``HF_HOME``), without any request when ``HF_HUB_OFFLINE=1`` or ``local_files_only=True``, with the
token of ``token=`` / ``HF_TOKEN`` / ``hf auth login`` for a private or gated repository, at
``revision`` (a branch, a tag or a commit hash: pin a commit for reproducible lists).

Nothing of the folder runs here: the snapshot then goes through the folder route, where the trust
rules hold unchanged (:func:`~uibk_embedding.encoder.trust.require_trust`: no code from the folder
without ``trust_remote_code=True``).

>>> is_hub_id("sentence-transformers/all-MiniLM-L6-v2"), is_hub_id("./models/mine"), is_hub_id("a/b/c")
(True, False, False)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: files of other frameworks' exports that a torch encoder never reads: not downloaded
IGNORE_PATTERNS = ["*.onnx", "onnx/*", "openvino/*", "*.h5", "*.msgpack", "*.ot", "*.tflite",
                   "coreml/*", "*.mlmodel", "*.mlpackage/*", "*.gguf", "tf_model*", "flax_model*",
                   "rust_model*"]


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a Hub model id (``org/name``: two non-empty parts of letters,
    digits, ``-``, ``_`` and ``.``, not starting like a path).

    >>> is_hub_id("DataScience-UIBK/uibk-embedding-v1"), is_hub_id("/srv/m/x"), is_hub_id("org/..")
    (True, False, False)
    """
    parts = name.split("/")
    return (len(parts) == 2 and all(parts) and not name.startswith((".", "~", "/"))
            and not any(p in (".", "..") for p in parts)
            and all(c.isalnum() or c in "-_." for c in name.replace("/", "")))


def resolve_model(
    name: str | os.PathLike,
    *,
    revision: str | None = None,
    token: bool | str | None = None,
    cache_folder: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> Path:
    """The local folder of ``name``: itself when that path exists, else the Hub snapshot of the
    model id ``name`` (see the module's description). A path that does not exist and is no Hub id
    raises ``FileNotFoundError``; so does a Hub id that is neither cached nor reachable, with
    huggingface_hub's reason. ``revision`` applies to Hub ids only.

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); resolve_model(d) == Path(d)
    True
    >>> resolve_model(d, revision="main")
    Traceback (most recent call last):
    ...
    ValueError: revision='main' applies to a Hugging Face Hub id; ... is a local folder
    """
    path = Path(name)
    if path.exists():
        if revision is not None:
            raise ValueError(f"revision={revision!r} applies to a Hugging Face Hub id; "
                             f"{path} is a local folder")
        return path
    if not is_hub_id(str(name)):
        raise FileNotFoundError(f"no encoder at {name}")
    try:
        return snapshot(str(name), revision=revision, token=token, cache_folder=cache_folder,
                        local_files_only=local_files_only)
    except FileNotFoundError as e:  # a mistyped local path reads as a Hub id too: say both
        raise FileNotFoundError(f"no local folder {name}, and as a Hugging Face Hub id: {e}") from e


def _version() -> str:
    """This package's installed version (for huggingface_hub's user agent)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("uibk-embedding")
    except PackageNotFoundError:  # a checkout on the path, not installed
        return "unknown"


def snapshot(repo_id: str, *, revision: str | None = None, token: bool | str | None = None,
             cache_folder: str | os.PathLike | None = None, local_files_only: bool = False) -> Path:
    """``huggingface_hub.snapshot_download`` of a model repository (the files of other
    frameworks' exports left out, :data:`IGNORE_PATTERNS`); its errors become
    ``FileNotFoundError`` naming the id, the revision and what to do.

    >>> import tempfile
    >>> snapshot("nobody/nothing", local_files_only=True, cache_folder=tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    FileNotFoundError: nobody/nothing is not in the Hugging Face cache and was not downloaded ...
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # offline, the cache only: snapshot_download itself, given a commit hash offline without
    # local_files_only, asks the Hub for the commit's file list and fails (huggingface_hub 1.33)
    local_files_only = local_files_only or bool(constants.HF_HUB_OFFLINE)
    kwargs: dict[str, Any] = {}
    if cache_folder is not None:
        kwargs["cache_dir"] = str(cache_folder)
    at = f" at revision {revision!r}" if revision else ""
    try:
        folder = snapshot_download(repo_id, repo_type="model", revision=revision, token=token,
                                   local_files_only=local_files_only, ignore_patterns=IGNORE_PATTERNS,
                                   library_name="uibk-embedding", library_version=_version(), **kwargs)
    except RevisionNotFoundError as e:
        raise FileNotFoundError(f"{repo_id}: the Hub has no revision {revision!r} ({e})") from e
    except RepositoryNotFoundError as e:  # also a private or gated repository without a token
        raise FileNotFoundError(f"{repo_id}: no such model on the Hub, or it is private or gated "
                                f"(log in with `hf auth login` or pass token=): {e}") from e
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"{repo_id}{at} is not in the Hugging Face cache and was not downloaded "
            f"(offline: HF_HUB_OFFLINE=1 or local_files_only=True, or the Hub could not be reached). "
            f"Download it where the Hub is reachable (`hf download {repo_id}`) into the cache this "
            f"machine reads (HF_HUB_CACHE), or give a local folder: {e}") from e
    except HfHubHTTPError as e:
        raise FileNotFoundError(f"{repo_id}{at}: the Hub refused the download: {e}") from e
    return Path(folder)


__all__ = ["IGNORE_PATTERNS", "is_hub_id", "resolve_model", "snapshot"]
