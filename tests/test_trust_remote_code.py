"""Model folders never run their own Python code without ``trust_remote_code=True``.

Every folder here is a tiny real model (a 2-layer BERT saved by transformers, sentence-transformers
or PyLate) with one planted route to folder code: a ``modules.json`` type that resolves to a
file of the folder (``pylate.Dense`` -> ``pylate.py``, ``evil.Transformer`` -> ``evil.py``, a
custom pooling module), an ``auto_map`` in ``config.json`` or ``tokenizer_config.json``, a file
shadowing an installed package name, a Hub reference in a type. Each planted file writes a
marker file when it is imported: every untrusted load must raise ``UntrustedCode`` and leave no
marker. Imported dynamic modules go to a cache under ``tmp_path`` (``HF_MODULES_CACHE``).
"""

from __future__ import annotations

import importlib
import json
import string
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers", minversion="6.0",
                         reason="the colbert extra (sentence-transformers >= 6) is not installed")
import sentence_transformers.models  # noqa: E402,F401  (st.models)

from uibk_embedding.encoder import load_encoder  # noqa: E402
from uibk_embedding.encoder.composed import check_colbert_folder  # noqa: E402
from uibk_embedding.encoder.pylate_model import custom_code  # noqa: E402
from uibk_embedding.encoder.trust import code_risks  # noqa: E402
from uibk_embedding.errors import UntrustedCode  # noqa: E402
from uibk_embedding.testing.colbert_folders import pylate_colbert  # noqa: E402
from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert  # noqa: E402

TRUST_HINT = "pass trust_remote_code=True if you trust this folder"


@pytest.fixture(autouse=True)
def _modules_cache(tmp_path, monkeypatch):
    """transformers copies dynamic modules into HF_MODULES_CACHE: keep them under tmp_path, and
    afterwards forget the ``transformers_modules`` package imported from there (left in
    ``sys.modules`` with its ``__path__`` under this tmp_path, it would make every later test's
    dynamic modules unimportable)."""
    import transformers.dynamic_module_utils as dmu

    cache = str(tmp_path / "hf_modules")
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", cache)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "transformers_modules"}
    yield
    for name in [k for k in sys.modules if k.split(".")[0] == "transformers_modules"]:
        del sys.modules[name]
    sys.modules.update(before)
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Clean folders, copied by each test: ``hf`` (a Hugging Face BERT), ``dense`` (a
    sentence-transformers model: Transformer, Pooling, Normalize) and ``colbert`` (PyLate's format)."""
    root = tmp_path_factory.mktemp("trust")
    letters = list(string.ascii_lowercase + string.digits)
    vocab = [*SPECIAL, *(f"[unused{i}]" for i in range(4)),
             *string.punctuation, *letters, *(f"##{c}" for c in letters), "wing", "lift"]
    tiny_bert(root / "hf", vocab, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st.SentenceTransformer(modules=[st.models.Transformer(str(root / "hf"), max_seq_length=64),
                                        st.models.Pooling(32, pooling_mode="cls"), st.models.Normalize()],
                               device="cpu").save(str(root / "dense"))
        pylate_colbert(root / "colbert", root / "hf", seed=1, query_length=16, document_length=40)
    return {name: root / name for name in ("hf", "dense", "colbert")}


def _copy(base, name, tmp_path) -> Path:
    import shutil

    # a unique folder name: transformers caches dynamic modules by folder name
    out = tmp_path / f"{name}_{tmp_path.name}"
    shutil.copytree(base[name], out)
    return out


def _plant(folder: Path, filename: str, marker: Path, body: str = "") -> None:
    """A module file that writes ``marker`` when it is imported."""
    (folder / filename).write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{body}")


def _set_type(folder: Path, idx: int, type_: str) -> None:
    mods = json.loads((folder / "modules.json").read_text())
    mods[idx]["type"] = type_
    (folder / "modules.json").write_text(json.dumps(mods))


def _edit_json(path: Path, **items) -> None:
    cfg = json.loads(path.read_text())
    cfg.update(items)
    path.write_text(json.dumps(cfg))


def _refused(call, marker: Path, *parts: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UntrustedCode) as e:
            call()
    msg = str(e.value)
    assert not marker.exists(), "the folder's code ran"
    for part in (TRUST_HINT, *parts):
        assert part in msg, (part, msg)
    return msg


# -- modules.json types ------------------------------------------------------------------------
def test_a_pylate_prefixed_type_resolving_to_a_folder_file_is_refused(base, tmp_path):
    """``pylate.Dense`` is not PyLate's class: sentence-transformers imports ``pylate.py`` from
    the folder itself."""
    folder = _copy(base, "colbert", tmp_path)
    marker = tmp_path / "marker"
    _plant(folder, "pylate.py", marker, "from pylate.models.Dense import Dense\n")
    _set_type(folder, 1, "pylate.Dense")
    # is_pylate_folder needs PyLate's config keys: the copy has them
    _refused(lambda: load_encoder(folder, device="cpu"), marker, str(folder), "pylate.Dense")
    assert custom_code(folder)[0] == ["pylate.Dense"]


def test_composed_tokens_folder_with_a_custom_transformer_is_refused(base, tmp_path):
    """``check_colbert_folder`` compared only the class name: ``evil.Transformer`` passed."""
    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    marker = tmp_path / "marker"
    _plant(tokens, "evil.py", marker, "from sentence_transformers.models import Transformer\n")
    _set_type(tokens, 0, "evil.Transformer")
    _refused(lambda: check_colbert_folder(tokens), marker, str(tokens), "evil.Transformer")
    _refused(lambda: load_encoder(dense=dense, tokens=tokens, device="cpu"), marker,
             str(tokens), "evil.Transformer")


def test_composed_dense_folder_with_a_custom_module_is_refused(base, tmp_path):
    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    marker = tmp_path / "marker"
    _plant(dense, "custom_pooling.py", marker, "from sentence_transformers.models import Pooling\n")
    _set_type(dense, 1, "custom_pooling.Pooling")
    _refused(lambda: load_encoder(dense=dense, tokens=tokens, device="cpu"), marker,
             str(dense), "custom_pooling.Pooling")


def test_the_cli_dense_tokens_route_is_refused(base, tmp_path):
    from uibk_embedding.apps.cli import main

    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    marker = tmp_path / "marker"
    _plant(dense, "custom_pooling.py", marker, "from sentence_transformers.models import Pooling\n")
    _set_type(dense, 1, "custom_pooling.Pooling")
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"_id": "d0", "text": "lift of a wing"}) + "\n")
    with pytest.raises(SystemExit, match="trust_remote_code=True"):
        main(["index", str(corpus), "--path", str(tmp_path / "store"), "--quiet",
              "--dense", str(dense), "--tokens", str(tokens)])
    assert not marker.exists()


def test_a_hub_reference_and_an_unknown_library_class_are_reasons():
    """Types are compared with exact class paths: a Hub reference (``repo--module.Class``), a
    sentence-transformers module that loads further types (``Router``) and a look-alike path
    are not on the list."""
    import tempfile

    d = Path(tempfile.mkdtemp())
    types = ["owner/repo--evil.Transformer", "sentence_transformers.models.Router",
             "sentence_transformers.models.Pooling.Evil", "sentence_transformers.models.Normalize"]
    (d / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": "", "type": t}
                                                for i, t in enumerate(types)]))
    reasons = code_risks(d)
    assert len(reasons) == 3
    for t in types[:3]:
        assert any(repr(t) in r for r in reasons), (t, reasons)


# -- auto_map ----------------------------------------------------------------------------------
def _auto_map_config(folder: Path, marker: Path) -> None:
    _plant(folder, "modeling_evil.py", marker,
           "from transformers import BertModel as EvilModel, BertConfig as EvilConfig\n")
    _plant(folder, "configuration_evil.py", marker, "from transformers import BertConfig as EvilConfig\n")
    _edit_json(folder / "config.json", auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                 "AutoModel": "modeling_evil.EvilModel"})


def test_auto_map_in_config_json_is_refused_for_a_hugging_face_folder(base, tmp_path):
    folder = _copy(base, "hf", tmp_path)
    marker = tmp_path / "marker"
    _auto_map_config(folder, marker)
    _refused(lambda: load_encoder(folder, device="cpu"), marker, str(folder), "config.json", "auto_map")


def test_auto_map_in_tokenizer_config_is_refused(base, tmp_path):
    folder = _copy(base, "hf", tmp_path)
    marker = tmp_path / "marker"
    _plant(folder, "tokenization_evil.py", marker,
           "from transformers import BertTokenizerFast as EvilTokenizer\n")
    _edit_json(folder / "tokenizer_config.json",
               auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    _refused(lambda: load_encoder(folder, device="cpu"), marker, "tokenizer_config.json", "auto_map")


def test_auto_map_in_a_composed_model_is_refused(base, tmp_path):
    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    marker = tmp_path / "marker"
    _auto_map_config(dense, marker)
    _refused(lambda: load_encoder(dense=dense, tokens=tokens, device="cpu"), marker,
             str(dense), "auto_map")
    dense2 = _copy(base, "dense", tmp_path / "again")
    _auto_map_config(tokens, marker)
    _refused(lambda: load_encoder(dense=dense2, tokens=tokens, device="cpu"), marker,
             str(tokens), "auto_map")


# -- files shadowing a package, a Dense activation --------------------------------------------
@pytest.mark.parametrize("shadow", ["pylate.py", "sentence_transformers.py", "pylate/__init__.py"])
def test_a_file_shadowing_an_installed_package_is_refused(base, tmp_path, shadow):
    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    marker = tmp_path / "marker"
    (tokens / shadow).parent.mkdir(exist_ok=True)
    _plant(tokens, shadow, marker)
    _refused(lambda: load_encoder(dense=dense, tokens=tokens, device="cpu"), marker,
             str(tokens), shadow.split("/")[0])


def test_a_dense_activation_outside_torch_nn_is_refused(base, tmp_path):
    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    mods = json.loads((tokens / "modules.json").read_text())
    cfg_file = tokens / mods[1]["path"] / "config.json"
    _edit_json(cfg_file, activation_function="json.JSONDecoder")
    with pytest.raises(UntrustedCode, match=r"json\.JSONDecoder"):
        load_encoder(dense=dense, tokens=tokens, device="cpu")


# -- what still loads ---------------------------------------------------------------------------
def test_clean_folders_have_no_reasons(base):
    from uibk_embedding.encoder.transformer import embedded_model_path

    for folder in (*base.values(), embedded_model_path()):
        assert code_risks(folder) == [], folder


def test_a_trusted_custom_module_loads(base, tmp_path):
    """The same custom dense module loads when the caller trusts the folder (and its code runs)."""
    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    marker = tmp_path / "marker"
    _plant(dense, "custom_pooling.py", marker, "from sentence_transformers.models import Pooling\n")
    _set_type(dense, 1, "custom_pooling.Pooling")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = load_encoder(dense=dense, tokens=tokens, device="cpu", trust_remote_code=True)
        lists = enc.encode_documents(["lift of a wing"], show_progress=False)
    assert marker.exists()
    assert lists[0].shape[1] == 128


def test_a_saved_composed_encoder_cannot_switch_trust_on(base, tmp_path):
    """A saved encoder's folder is data: its ``colbert_options`` cannot set trust_remote_code
    for the model it loads (only the caller can)."""
    from uibk_embedding.encoder.fixed_projections import CONFIG_NAME

    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_encoder(dense=dense, tokens=tokens, device="cpu").save(tmp_path / "saved")
        _edit_json(tmp_path / "saved" / CONFIG_NAME,
                   colbert_options={"model_kwargs": {"trust_remote_code": True}})
        with pytest.raises(UntrustedCode, match=r"colbert_options set trust_remote_code \(model_kwargs\)"):
            load_encoder(tmp_path / "saved", device="cpu")
        enc = load_encoder(tmp_path / "saved", device="cpu", trust_remote_code=True)
    assert enc.colbert_options == {"model_kwargs": {"trust_remote_code": True}}


def test_a_tokenizer_in_another_folder_is_inspected_too(base, tmp_path):
    """``sentence_bert_config.json`` may load the tokenizer from another folder
    (``tokenizer_name_or_path``): that folder's ``auto_map`` counts as well."""
    dense, tokens = _copy(base, "dense", tmp_path), _copy(base, "colbert", tmp_path)
    other = _copy(base, "hf", tmp_path / "other")
    marker = tmp_path / "marker"
    _plant(other, "tokenization_evil.py", marker,
           "from transformers import BertTokenizerFast as EvilTokenizer\n")
    _edit_json(other / "tokenizer_config.json",
               auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    _edit_json(dense / "sentence_bert_config.json", tokenizer_name_or_path=str(other))
    _refused(lambda: load_encoder(dense=dense, tokens=tokens, device="cpu"), marker,
             str(dense), "tokenizer_config.json", "auto_map")
