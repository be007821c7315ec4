"""Hugging Face Hub ids: ``load_encoder("org/name", revision=..., trust_remote_code=...)`` and
``--encoder ID`` through huggingface_hub's cache, with no network and no hub server.

The cache is laid out as huggingface_hub lays it out (``models--org--name/blobs``,
``snapshots/<commit>/`` links to the blobs, ``refs/<branch or tag>``: :func:`hub_cache`), and
huggingface_hub's own readers (``scan_cache_dir``, ``try_to_load_from_cache``) must read it back
before any test uses it. ``HF_HUB_OFFLINE=1`` (in a subprocess: huggingface_hub reads it when
imported) or ``local_files_only=True`` keep every call off the network.

The trust routes of tests/test_trust_remote_code.py run again on folders that come from the cache:
a planted route to the folder's code is refused without ``trust_remote_code=True`` (and the code
does not run), and runs with it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import string
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.transformer import embedded_model_path
from uibk_embedding.errors import UntrustedCode

huggingface_hub = pytest.importorskip("huggingface_hub")

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def hub_cache(cache: Path, repo_id: str, folder: Path, *, refs: tuple[str, ...] = ("main",),
              commit: str | None = None) -> str:
    """Put ``folder``'s files into the Hub cache ``cache`` as revision ``commit`` of ``repo_id``
    (blobs named by their SHA-256, snapshot links to them, ``refs`` naming the commit); return
    the commit hash."""
    from huggingface_hub.file_download import repo_folder_name

    files = sorted(p for p in folder.rglob("*") if p.is_file())
    commit = commit or hashlib.sha1(b"".join(p.read_bytes() for p in files)).hexdigest()
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    for f in files:
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / f.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    # huggingface_hub itself reads it back
    info = {r.repo_id: r for r in huggingface_hub.scan_cache_dir(cache).repos}[repo_id]
    assert {rev.commit_hash for rev in info.revisions} >= {commit}
    found = huggingface_hub.try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=refs[0])
    assert found is not None and Path(found).parent == repo / "snapshots" / commit, found
    return commit


@pytest.fixture(scope="module")
def minilm_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub")
    commit = hub_cache(cache, MINILM, embedded_model_path(), refs=("main", "v1"))
    return cache, commit


def test_a_hub_id_loads_from_the_cache_offline_in_python_and_on_the_command_line(minilm_cache, tmp_path):
    """``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` (what a user sets), nothing passed: the id
    resolves to the cached snapshot, which loads as a Hugging Face folder (transformers) and gives
    the embedded default's lists; the CLI's ``--encoder ID`` indexes and searches with it."""
    cache, commit = minilm_cache
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in
                              (("a", "the wing lift in a propeller slipstream"), ("b", "boundary layer"))))
    probe = f"""if True:
        import json, sys
        import numpy as np
        from uibk_embedding.encoder import load_encoder
        from uibk_embedding.apps.cli import main
        enc = load_encoder({MINILM!r})
        ref = load_encoder()
        texts = ["a wing in a slipstream", "heat transfer at Mach 3"]
        err = max(float(np.abs(a - b).max()) for a, b in
                  zip(enc.encode_documents(texts), ref.encode_documents(texts), strict=True))
        print("RESULT", json.dumps({{"model": enc.model_name, "err": err}}))
        sys.argv = ["uibk-embed", "index", {str(corpus)!r}, "--path", {str(tmp_path / "store")!r},
                    "--encoder", {MINILM!r}, "--quiet"]
        assert main() == 0
        sys.argv = ["uibk-embed", "search", "slipstream lift", "--path", {str(tmp_path / "store")!r},
                    "--encoder", {MINILM!r}]
        raise SystemExit(main())
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
           "UIBK_CACHE": str(tmp_path / "uibk-cache")}
    env.pop("HF_HOME", None)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["model"].endswith(f"snapshots/{commit}"), result
    assert result["err"] <= 1e-5, result
    first = next(x for x in done.stdout.splitlines() if x.split()[:1] == ["1"])
    assert "  a  the wing lift" in first, done.stdout


def test_the_command_line_passes_revision_to_the_hub(minilm_cache, tmp_path):
    """``--revision`` reaches the Hub resolution of ``--encoder ID``: a tag in the cache indexes,
    the commit hash searches, a revision not in the cache is the one-line error naming it
    (offline, from the cache)."""
    cache, commit = minilm_cache
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "the wing lift in a propeller slipstream"}) + "\n")
    store = str(tmp_path / "store")
    probe = f"""if True:
        import json
        from uibk_embedding.apps.cli import main
        status = []
        for argv in (["index", {str(corpus)!r}, "--path", {store!r}, "--quiet", "--revision", "v1"],
                     ["search", "slipstream", "--path", {store!r}, "--json", "--revision", {commit!r}],
                     ["search", "slipstream", "--path", {store!r}, "--revision", "v2"]):
            try:
                status.append(main(argv + ["--encoder", {MINILM!r}]))
            except SystemExit as e:
                status.append(e.code)
        print("RESULT", json.dumps(status))
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
           "UIBK_CACHE": str(tmp_path / "uibk-cache")}
    env.pop("HF_HOME", None)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    assert json.loads(line[len("RESULT "):]) == [0, 0, 2], done.stderr[-3000:]
    hits = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("{")))["hits"]
    assert [h["id"] for h in hits] == ["a"]
    assert "revision 'v2' is not in the Hugging Face cache" in done.stderr


def test_revisions_tokens_and_a_missing_model(minilm_cache):
    cache, commit = minilm_cache
    hub = {"cache_folder": cache, "local_files_only": True, "device": "cpu"}
    for rev in (None, "main", "v1", commit):
        enc = load_encoder(MINILM, revision=rev, **hub)
        assert Path(enc.model_name).name == commit
    with pytest.raises(FileNotFoundError, match=r"revision 'v2' is not in the Hugging Face cache"):
        load_encoder(MINILM, revision="v2", **hub)
    with pytest.raises(FileNotFoundError, match=r"no local folder nobody/nothing, and as a Hugging Face "
                                                r"Hub id: nobody/nothing is not in the Hugging Face "
                                                r"cache.*hf download nobody/nothing"):
        load_encoder("nobody/nothing", **hub)
    # a composed pair by ids, and a revision for a folder or the embedded default is refused
    with pytest.raises(ValueError, match="applies to a Hugging Face Hub id"):
        load_encoder(embedded_model_path(), revision="main")
    with pytest.raises(ValueError, match="applies to a Hugging Face Hub id"):
        load_encoder(revision="main")


# -- the trust routes, on folders from the cache --------------------------------------------------
@pytest.fixture(autouse=True)
def _modules_cache(tmp_path, monkeypatch):
    """Dynamic modules go under tmp_path and are forgotten afterwards (as in
    tests/test_trust_remote_code.py)."""
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "transformers_modules"}
    yield
    for name in [k for k in sys.modules if k.split(".")[0] == "transformers_modules"]:
        del sys.modules[name]
    sys.modules.update(before)
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Clean tiny folders: ``hf`` (a BERT), ``dense`` (sentence-transformers), ``colbert`` (PyLate's
    format)."""
    st = pytest.importorskip("sentence_transformers", minversion="6.0",
                             reason="the colbert extra (sentence-transformers >= 6) is not installed")
    import sentence_transformers.models  # noqa: F401  (st.models)

    from uibk_embedding.testing.colbert_folders import pylate_colbert
    from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert

    root = tmp_path_factory.mktemp("trust-hub")
    letters = list(string.ascii_lowercase + string.digits)
    vocab = [*SPECIAL, *string.punctuation, *letters, *(f"##{c}" for c in letters), "wing", "lift"]
    tiny_bert(root / "hf", vocab, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st.SentenceTransformer(modules=[st.models.Transformer(str(root / "hf"), max_seq_length=64),
                                        st.models.Pooling(32, pooling_mode="cls"), st.models.Normalize()],
                               device="cpu").save(str(root / "dense"))
        pylate_colbert(root / "colbert", root / "hf", seed=1, query_length=16, document_length=40)
    return root


def _planted(base: Path, name: str, tmp_path: Path, marker: Path, route: str) -> Path:
    """A copy of ``base/name`` with one route to its own code that writes ``marker`` when run."""
    import shutil

    folder = tmp_path / f"src-{name}-{route}"
    shutil.copytree(base / name, folder)

    def plant(filename: str, body: str = "") -> None:
        (folder / filename).parent.mkdir(exist_ok=True)
        (folder / filename).write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{body}")

    def edit(file: str, **items) -> None:
        cfg = json.loads((folder / file).read_text())
        cfg.update(items)
        (folder / file).write_text(json.dumps(cfg))

    def set_type(idx: int, type_: str) -> None:
        mods = json.loads((folder / "modules.json").read_text())
        mods[idx]["type"] = type_
        (folder / "modules.json").write_text(json.dumps(mods))

    if route == "config-auto-map":
        plant("modeling_evil.py", "from transformers import BertModel as EvilModel\n")
        edit("config.json", auto_map={"AutoModel": "modeling_evil.EvilModel"})
    elif route == "tokenizer-auto-map":
        plant("tokenization_evil.py", "from transformers import BertTokenizerFast as EvilTokenizer\n")
        edit("tokenizer_config.json", auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    elif route == "module-type":
        plant("pylate.py", "from pylate.models.Dense import Dense\n")
        set_type(1, "pylate.Dense")
    elif route == "custom-pooling":
        plant("custom_pooling.py", "from sentence_transformers.models import Pooling\n")
        set_type(1, "custom_pooling.Pooling")
    elif route == "shadow":
        plant("sentence_transformers/__init__.py")
    elif route == "hub-reference":
        set_type(1, "evil-org/evil-repo--pooling.Pooling")
    return folder


# (route, the folder it is planted in, how the id is loaded)
ROUTES = [
    ("config-auto-map", "hf", "path"),
    ("tokenizer-auto-map", "hf", "path"),
    ("module-type", "colbert", "path"),
    ("module-type", "colbert", "tokens"),
    ("custom-pooling", "dense", "dense"),
    ("shadow", "colbert", "tokens"),
    ("hub-reference", "dense", "dense"),
    ("config-auto-map", "dense", "dense"),
]


@pytest.mark.parametrize(("route", "name", "how"), ROUTES)
def test_a_hub_folder_never_runs_its_code_without_trust(base, tmp_path, route, name, how):
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    evil = _planted(base, name, tmp_path, marker, route)
    hub_cache(cache, f"evil/{name}", evil)
    hub_cache(cache, "good/dense", base / "dense")
    hub_cache(cache, "good/colbert", base / "colbert")
    kw = {"cache_folder": cache, "local_files_only": True, "device": "cpu"}
    call = {"path": lambda: load_encoder(f"evil/{name}", **kw),
            "dense": lambda: load_encoder(dense=f"evil/{name}", tokens="good/colbert", **kw),
            "tokens": lambda: load_encoder(dense="good/dense", tokens=f"evil/{name}", **kw)}[how]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UntrustedCode) as e:
            call()
    assert not marker.exists(), "the folder's code ran"
    assert "pass trust_remote_code=True if you trust this folder" in str(e.value)
    assert "models--evil--" in str(e.value)  # names the snapshot folder that was refused


def test_a_trusted_hub_folder_runs_its_code(base, tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    hub_cache(cache, "org/dense", _planted(base, "dense", tmp_path, marker, "custom-pooling"))
    hub_cache(cache, "org/colbert", base / "colbert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = load_encoder(dense="org/dense", tokens="org/colbert", trust_remote_code=True,
                           cache_folder=cache, local_files_only=True, device="cpu")
        lists = enc.encode_documents(["lift of a wing"], show_progress=False)
    assert marker.exists() and lists[0].shape[1] == 128
    assert np.isfinite(lists[0]).all()
