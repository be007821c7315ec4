"""Multi-vector model folders (issues 26, 60): load one natively, save ours as one, and the refusals.

Loading runs sentence-transformers 6's ``MultiVectorEncoder`` (PyLate is not needed). The
folders are built here: a tiny random UIBK model and the embedded default (MiniLM), each saved
by ``save_sentence_transformers`` (custom modules: ``tagged_modules.py``; what
``MultiVectorEncoder(folder, trust_remote_code=True)`` loads) and by ``save_pylate`` (custom
modules written for PyLate: ``branched_transformer.py``, ``hybrid_tokens.py``; ``load_encoder``
reads their files with the sentence-transformers 6 modules), a plain ColBERT model in PyLate's
format (untagged) and one with 96-d vectors. Every comparison of two encodings of the same texts
in the same batch uses ``SAME_BATCH`` = 1e-5: the two code paths differ only in float32 rounding
(measured here: 0 to 4.8e-7). PyLate itself runs our PyLate export in tests/test_pylate_interop.py,
in PyLate's own environment (it pins sentence-transformers 5.3: ``make pylate-env``).
"""

from __future__ import annotations

import json
import string
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers", minversion="6.0",
                         reason="the colbert extra (sentence-transformers >= 6) is not installed")

from uibk_embedding.encoder import TaggedFormat, load_encoder  # noqa: E402
from uibk_embedding.encoder.pylate_model import (  # noqa: E402
    PyLateEncoder,
    custom_code,
    model_hash,
    probe_format,
    save_pylate,
    save_sentence_transformers,
)
from uibk_embedding.encoder.shared import SharedEncoder  # noqa: E402
from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer  # noqa: E402
from uibk_embedding.errors import UntrustedCode  # noqa: E402
from uibk_embedding.testing.colbert_folders import pylate_colbert  # noqa: E402
from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert  # noqa: E402

SAME_BATCH = 1e-5
TEXTS = [
    "the wing lift in a slipstream",
    "heat transfer, in a boundary layer!",
    "what is the flow of heat?",
    "a",
    "lift " * 60,
    "boundary layer flow on a wing: heat transfer (of the slipstream) in 3 parts",
    "\u200b",  # no token: the native MiniLM list keeps [SEP] as its one token row (the export had none)
]
#: the folders of our two encoders: "NAME" saved by save_sentence_transformers, "NAME_pylate" by save_pylate
EXPORTS = ["uibk", "minilm", "uibk_pylate", "minilm_pylate"]


def _max_diff(a, b) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
               for x, y in zip(a, b, strict=True))


def _mve(folder, trust=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return st.MultiVectorEncoder(str(folder), device="cpu", trust_remote_code=trust)


def _mve_encode(model, texts, is_query):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = model.encode_query if is_query else model.encode_document
        return run(texts, convert_to_numpy=True)


@pytest.fixture(scope="module")
def natives():
    cfg = UIBKConfig.tiny()
    return {"uibk": UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS * 3), seed=0, device="cpu"),
            "minilm": load_encoder(device="cpu")}


@pytest.fixture(scope="module")
def folders(natives, tmp_path_factory):
    root = tmp_path_factory.mktemp("multivector")
    out = {name: save_sentence_transformers(enc, root / name) for name, enc in natives.items()}
    out.update({f"{name}_pylate": save_pylate(enc, root / f"{name}_pylate") for name, enc in natives.items()})
    # a plain ColBERT model in PyLate's format (Transformer -> Dense, untagged) and one with 96-d vectors
    letters = list(string.ascii_lowercase + string.digits)
    vocab = [*SPECIAL, *string.punctuation, *letters,
             *(f"##{c}" for c in letters), "wing", "lift", "heat", "flow"]
    tiny_bert(root / "bert", vocab, seed=0)
    for name, size in (("colbert", 128), ("colbert96", 96)):
        out[name] = pylate_colbert(root / name, root / "bert", seed=1, embedding_size=size,
                                   query_length=16, document_length=40)
    return out


@pytest.fixture(scope="module")
def loaded(folders):
    return {name: load_encoder(folders[name], trust_remote_code=True, device="cpu") for name in EXPORTS}


def _native(natives, name):
    return natives[name.removesuffix("_pylate")]


@pytest.mark.parametrize("name", ["uibk", "minilm"])
@pytest.mark.parametrize("is_query", [False, True])
def test_multi_vector_encoder_returns_the_native_tagged_lists(natives, folders, name, is_query):
    """sentence_transformers.MultiVectorEncoder(folder, trust_remote_code=True).encode_query /
    encode_document on our sentence-transformers 6 export == the native encoder (w=1)."""
    got = _mve_encode(_mve(folders[name]), TEXTS, is_query)
    nat = natives[name]
    want = nat.encode_queries(TEXTS, dense_weight=1.0) if is_query else nat.encode_documents(TEXTS)
    diff = _max_diff(got, want)
    kind = "queries" if is_query else "documents"
    print(f"{name} {kind}: MultiVectorEncoder vs native, max |diff| {diff:.2e}")
    assert diff <= SAME_BATCH


@pytest.mark.parametrize("name", ["uibk", "minilm"])
def test_load_encoder_runs_the_model_and_applies_the_dense_weight(folders, loaded, name):
    enc = loaded[name]
    assert isinstance(enc, PyLateEncoder)
    mve = _mve(folders[name])
    for is_query in (False, True):
        ref = _mve_encode(mve, TEXTS, is_query)
        got = enc.encode_queries(TEXTS, dense_weight=1.0) if is_query else enc.encode_documents(TEXTS)
        diff = _max_diff(got, ref)
        kind = "queries" if is_query else "documents"
        print(f"{name}: load_encoder vs MultiVectorEncoder ({kind}) {diff:.2e}")
        assert diff <= SAME_BATCH
    heavy = enc.encode_queries(TEXTS, dense_weight=2.5)
    ref = _mve_encode(mve, TEXTS, True)
    for h, r in zip(heavy, ref, strict=True):
        np.testing.assert_allclose(h[:3], 2.5 * r[:3], atol=3 * SAME_BATCH)  # slots scaled
        np.testing.assert_allclose(h[3:], r[3:], atol=SAME_BATCH)  # tokens unchanged


@pytest.mark.parametrize("name", EXPORTS)
def test_round_trip_native_export_load_encoder(natives, loaded, name):
    nat, enc = _native(natives, name), loaded[name]
    docs = _max_diff(enc.encode_documents(TEXTS), nat.encode_documents(TEXTS))
    queries = _max_diff(enc.encode_queries(TEXTS), nat.encode_queries(TEXTS))  # both default weights
    print(f"{name}: native -> export -> load_encoder: documents {docs:.2e}, queries {queries:.2e} "
          f"(dense weight {enc.dense_weight:g})")
    assert enc.dense_weight == nat.dense_weight  # recorded by the export
    assert max(docs, queries) <= SAME_BATCH


def test_format_is_read_from_the_tags_and_names_the_model(folders, loaded):
    for name in EXPORTS:
        enc = loaded[name]
        assert (enc.format.beta, enc.format.lambda_) == (0.9, 0.75)
        assert enc.format.projection == f"pylate-{model_hash(folders[name])}"
        p = enc.probe
        assert p.pairs == 12 and p.aligned_pairs >= 1 and p.max_identity_error < 1e-5
        print(f"{name}: probe {p}")
    a, b = loaded["uibk"], loaded["minilm"]
    # a store filled by one model refuses the other (and the native encoder it was made from)
    assert "not pylate-" in a.format.conflict(b.format)
    assert a.format.conflict(TaggedFormat(projection="random-0123")) is not None
    assert a.format.conflict(a.format) is None


@pytest.mark.parametrize("name,classes", [
    ("uibk", ("tagged_modules.TaggedInput", "tagged_modules.TaggedLists", "tagged_modules.py")),
    ("uibk_pylate", ("branched_transformer.BranchedTransformer", "hybrid_tokens.HybridTokens",
                     "branched_transformer.py", "hybrid_tokens.py"))])
def test_without_trust_remote_code_the_folder_is_refused(folders, name, classes):
    with pytest.raises(UntrustedCode) as e:
        load_encoder(folders[name])
    msg = str(e.value)
    print(msg)
    for part in (*classes, "trust_remote_code=True", "--trust-remote-code"):
        assert part in msg
    assert custom_code(folders["colbert"]) == ([], [])  # library modules only: nothing to trust


def test_sentence_transformers_6_refuses_local_module_code_without_trust_too(folders):
    """sentence-transformers 5 imported a local folder's module code even with
    trust_remote_code=False (why our check exists); 6 refuses it too. Ours still asks first, on
    every route (tests/test_trust_remote_code.py)."""
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        _mve(folders["uibk"], trust=False)


def test_a_pylate_export_saved_again_by_pylate_still_loads_by_its_files(folders, loaded, tmp_path):
    """PyLate's own save of our export (MTEB, fine-tuning) writes the same module files but a
    configuration without our block: it is still read by its files (save_pylate's layout)."""
    import shutil

    resaved = shutil.copytree(folders["uibk_pylate"], tmp_path / "resaved")
    cfg = json.loads((resaved / "config_sentence_transformers.json").read_text())
    del cfg["uibk_embedding"]
    (resaved / "config_sentence_transformers.json").write_text(json.dumps(cfg))
    again = load_encoder(resaved, trust_remote_code=True, device="cpu")
    assert (again.format.beta, again.format.lambda_) == (0.9, 0.75)
    want = loaded["uibk_pylate"].encode_documents(TEXTS)
    assert _max_diff(again.encode_documents(TEXTS), want) <= SAME_BATCH


def test_custom_modules_written_for_pylate_do_not_run_under_sentence_transformers_6(folders, tmp_path):
    """A PyLate folder with custom modules that are not ours (the released UIBK-Embedding-v1 is
    one, docs/loading.md) runs its own modules through MultiVectorEncoder. Ours, written for
    PyLate and sentence-transformers 5 (a Transformer subclass that sets ``tokenizer``, which
    sentence-transformers 6 made a read-only property; a PyLate Dense), cannot: the error names
    the classes and what to do."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pylate") is not None:
        pytest.skip("PyLate is installed here: the folder's own code runs against another stack")
    foreign = shutil.copytree(folders["uibk_pylate"], tmp_path / "foreign")
    (foreign / "hybrid_tokens.py").rename(foreign / "released_tokens.py")
    mods = json.loads((foreign / "modules.json").read_text())
    mods[1]["type"] = "released_tokens.HybridTokens"  # not save_pylate's layout: its code runs
    (foreign / "modules.json").write_text(json.dumps(mods))
    with pytest.raises((ImportError, RuntimeError), match=r"its own module code .*BranchedTransformer.*"
                       r"need PyLate's own environment") as e:
        load_encoder(foreign, trust_remote_code=True, device="cpu")
    print(e.value)


def test_a_plain_colbert_model_is_refused(folders):
    with pytest.raises(ValueError, match=r"not tagged lists.*load_encoder\(dense=") as e:
        load_encoder(folders["colbert"])
    print(e.value)


def test_wrong_dimensions_are_refused(folders):
    with pytest.raises(ValueError, match="96 dimensions; the tagged format has 128") as e:
        load_encoder(folders["colbert96"])
    print(e.value)


def test_probe_refusals():
    fmt = TaggedFormat()
    rng = np.random.default_rng(0)

    def mk(n):
        return fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))

    good = [mk(4), mk(6)]
    two_slots = [x[1:] for x in good]
    with pytest.raises(ValueError, match="have 2 slot rows"):
        probe_format(two_slots, two_slots)
    with pytest.raises(ValueError, match="not unit vectors"):
        probe_format([2 * x for x in good], good)
    odd = [x.copy() for x in good]
    odd[0][5, 0] = 0.2  # a second token tag value
    odd[0][5] /= np.linalg.norm(odd[0][5])
    with pytest.raises(ValueError, match="not one value"):
        probe_format(odd, good)
    other = TaggedFormat(beta=0.8, lambda_=0.5)
    q = [other.build(rng.normal(size=(3, 127)), rng.normal(size=(5, 127)))]
    got, _ = probe_format(q, [other.build(rng.normal(size=(3, 127)), rng.normal(size=(7, 127)))])
    assert (got.beta, got.lambda_) == (0.8, 0.5)


@pytest.mark.parametrize("save", [save_pylate, save_sentence_transformers])
def test_composed_and_pylate_encoders_are_not_exported(loaded, tmp_path, save):
    from uibk_embedding.encoder.composed import ComposedEncoder

    if save is save_pylate:  # save_sentence_transformers takes it (tests/test_composed.py)
        with pytest.raises(NotImplementedError, match="composed encoder runs two models"):
            save(ComposedEncoder.__new__(ComposedEncoder), tmp_path / "x")
    with pytest.raises(ValueError, match=r"already the .*model folder"):
        save(loaded["uibk"], tmp_path / "y")


def test_a_model_whose_tokenizer_is_no_cls_sep_template_is_not_exported(tmp_path):
    # the PyLate module reads tokens at 1 .. n - 2; the native encoder now reads them from the
    # special-tokens mask: an end-token-only tokenizer (Qwen, T5 style) exported other lists
    from tokenizers.processors import TemplateProcessing

    tiny_bert(tmp_path / "m", [*SPECIAL, *string.ascii_lowercase, "wing", "lift"], seed=0, layers=1)
    enc = load_encoder(tmp_path / "m", device="cpu")
    sep = enc.tokenizer.convert_tokens_to_ids("[SEP]")
    enc.tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="$A [SEP]", pair="$A [SEP] $B [SEP]", special_tokens=[("[SEP]", sep)])
    assert enc.tokenizer.convert_ids_to_tokens(enc.tokenizer("wing lift")["input_ids"])[-1] == "[SEP]"
    with pytest.raises(NotImplementedError, match=r"one special token at each end"):
        save_pylate(enc, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_shared_encoder_loads_a_pylate_folder(folders, loaded):
    with SharedEncoder(folders["uibk"], device="cpu", trust_remote_code=True) as shared:
        assert shared.format == loaded["uibk"].format
        got = shared.encode_documents(TEXTS)
        q = shared.encode_queries(TEXTS[:2], dense_weight=3.0)
    assert _max_diff(got, loaded["uibk"].encode_documents(TEXTS)) <= SAME_BATCH
    assert _max_diff(q, loaded["uibk"].encode_queries(TEXTS[:2], dense_weight=3.0)) <= SAME_BATCH
    with pytest.raises(UntrustedCode):
        SharedEncoder(folders["uibk"], device="cpu")


def test_cli_index_and_search_with_trust_remote_code(folders, tmp_path, capsys):
    from uibk_embedding.apps.cli import main
    from uibk_embedding.encoder.server import build_parser

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps({"_id": f"d{i}", "text": t}) for i, t in enumerate(TEXTS)) + "\n")
    store = tmp_path / "store"
    enc = ["--encoder", str(folders["uibk"])]
    with pytest.raises(SystemExit, match="--trust-remote-code"):
        main(["index", str(corpus), "--path", str(store), "--quiet", *enc])
    assert main(["index", str(corpus), "--path", str(store), "--quiet", *enc, "--trust-remote-code"]) == 0
    assert f"indexed {len(TEXTS)} documents" in capsys.readouterr().out
    assert main(["search", TEXTS[0], "--path", str(store), "--json", "-k", "2", *enc,
                 "--trust-remote-code"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "d0"
    # another model's store is refused: its format records this model's content hash
    with pytest.raises(SystemExit, match="its lists were encoded with projection pylate-"):
        main(["search", "wing", "--path", str(store), "--encoder", str(folders["minilm"]),
              "--trust-remote-code"])
    assert build_parser().parse_args(["--encoder", "x", "--trust-remote-code"]).trust_remote_code


def test_cli_export_pylate(natives, loaded, tmp_path, capsys):
    from uibk_embedding.apps.cli import main

    native_folder = natives["uibk"].save_pretrained(tmp_path / "native")
    out = tmp_path / "exported"
    assert main(["export-pylate", str(out), "--encoder", str(native_folder)]) == 0
    assert "trust_remote_code=True" in capsys.readouterr().out
    again = load_encoder(out, trust_remote_code=True, device="cpu")
    assert _max_diff(again.encode_documents(TEXTS), loaded["uibk"].encode_documents(TEXTS)) <= SAME_BATCH


@pytest.mark.parametrize("name", ["uibk", "minilm"])
def test_other_batchings_stay_within_the_batching_noise(folders, loaded, name):
    """Our pipeline's batches (a small token budget: several batches) against
    MultiVectorEncoder's one batch: within the same-batch constant plus twice the encoder's
    measured batching noise."""
    from uibk_embedding.testing import batching_noise

    enc = loaded[name]
    noise = batching_noise(enc, TEXTS, batchings=((2, 1), (3, 2)))
    ref = _mve_encode(_mve(folders[name]), TEXTS, False)
    budget = enc.batch_tokens
    try:
        enc.batch_tokens = 64
        got = enc.encode_documents(TEXTS)
    finally:
        enc.batch_tokens = budget
    diff = _max_diff(got, ref)
    print(f"{name}: batching noise {noise:.2e}; several batches vs MultiVectorEncoder's one: {diff:.2e}")
    assert diff <= SAME_BATCH + 2 * noise


def test_readme_example_loads_a_pylate_folder(folders, monkeypatch, tmp_path):
    """The "Use the released model" Python block of README.md, run as written with the released
    folder's name pointing at the tiny exported UIBK model."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Use the released model", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"models/uibk-embedding-v1"' in code
    code = code.replace('"models/uibk-embedding-v1"', repr(str(folders["uibk"])))
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    assert (ns["enc"].format.beta, ns["enc"].format.lambda_) == (0.9, 0.75)
    assert ns["enc"].format.projection.startswith("pylate-") and ns["q"].shape[1] == 128


def test_uibk_embed_serve_and_the_ray_path_pass_trust_remote_code(folders, loaded):
    """`uibk-embed serve --encoder FOLDER --trust-remote-code` (a real server process) and the Ray
    path's format lookup (``encoder_options``) load the PyLate folder."""
    pytest.importorskip("uvicorn")
    from uibk_embedding.apps.distributed import encoder_format
    from uibk_embedding.encoder.remote import RemoteEncoder
    from uibk_embedding.encoder.server import serve_subprocess

    local = loaded["uibk"]
    assert encoder_format(str(folders["uibk"]), {"trust_remote_code": True}) == local.format
    with pytest.raises(UntrustedCode):
        encoder_format(str(folders["uibk"]))
    with serve_subprocess("--encoder", str(folders["uibk"]), "--trust-remote-code", "--device", "cpu") as url:
        with RemoteEncoder(url) as enc:
            assert enc.format == local.format
            got = enc.encode_documents(TEXTS)
    assert _max_diff(got, local.encode_documents(TEXTS)) == 0.0  # the same encoder, the same batches


def test_framework_wrappers_take_the_pylate_encoder(loaded):
    pytest.importorskip("langchain_core")
    from uibk_embedding.adapters import open_store
    from uibk_embedding.integrations.langchain import UIBKVectorStore

    enc = loaded["uibk"]
    vs = UIBKVectorStore(encoder=enc, store=open_store("exact", format=enc.format))
    vs.add_texts(TEXTS, ids=[f"d{i}" for i in range(len(TEXTS))])
    assert vs.similarity_search(TEXTS[1], k=1)[0].page_content == TEXTS[1]


def test_the_probe_reads_bfloat16_rounded_tags_as_the_released_constants():
    """A model that computes its tags in bfloat16: the format still reads beta 0.9, lambda 0.75."""
    fmt = TaggedFormat()
    rng = np.random.default_rng(3)

    def bf16(x):
        y = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
        return y / np.linalg.norm(y, axis=1, keepdims=True)

    lists = [bf16(fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))) for n in (4, 6, 9)]
    got, report = probe_format(lists[:1], lists[1:])
    assert (got.beta, got.lambda_) == (0.9, 0.75)
    assert report.beta_measured != 0.9 or report.lambda_measured != 0.75  # they were rounded


def test_bfloat16_weights_on_the_cpu(folders, loaded):
    """The CUDA default, bfloat16 weights, run on the CPU: the probe accepts it, same format."""
    enc = load_encoder(folders["uibk"], trust_remote_code=True, device="cpu", dtype="bfloat16")
    assert enc.format == loaded["uibk"].format
    diff = _max_diff(enc.encode_documents(TEXTS), loaded["uibk"].encode_documents(TEXTS))
    print(f"bfloat16 vs float32 weights (CPU), max |diff| {diff:.3f}")
    assert diff < 0.5


def test_the_probe_snaps_only_where_stores_take_the_lists():
    """The probe snaps a measured beta to the 0.05 grid within 2e-3 (a bfloat16 model's tags are
    rounded), but beta 0.9018 read as 0.9 moves the token tag by 1.0%, past the 0.8% a store's
    tag check allows: the folder loaded and every store refused its lists. The grid is taken
    only where its tags lie within half that; a bfloat16-rounded beta 0.9 still snaps."""
    from uibk_embedding.adapters.base import validate_document

    rng = np.random.default_rng(0)
    for true, declared in ((0.9018, 0.9018), (0.9515, 0.9515), (0.9, 0.9)):
        fmt = TaggedFormat(beta=true)

        def mk(n, fmt=fmt):
            return fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))

        got, _ = probe_format([mk(4), mk(3)], [mk(9), mk(6)])
        assert got.beta == declared
        validate_document(mk(5), "doc", got)  # the lists it declared pass the stores' check
    bf16 = TaggedFormat(beta=0.9)
    lists = [bf16.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127))) for n in (4, 3, 9, 6)]
    rounded = [torch.from_numpy(x).to(torch.bfloat16).float().numpy() for x in lists]
    rounded = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in rounded]
    assert probe_format(rounded[:2], rounded[2:])[0].beta == 0.9


def test_no_forward_pass_exceeds_the_token_budget(loaded, monkeypatch):
    # batches are cut on an estimate from the characters (a third of a token each): Chinese text
    # has a token a character, so a PyLate batch ran about 3 times batch_tokens in one pass
    enc = loaded["uibk"]
    texts = ["机翼的升力边界层传热" * (4 + i % 5) for i in range(40)]
    want = enc.encode_documents(texts)
    sizes = []
    forward = enc.colbert.forward

    def spy(features, *args, **kwargs):
        sizes.append(tuple(features["input_ids"].shape))
        return forward(features, *args, **kwargs)

    monkeypatch.setattr(enc, "batch_tokens", 256)
    monkeypatch.setattr(enc.colbert, "forward", spy)
    got = enc.encode_documents(texts)
    assert len(sizes) > 1
    over = [(b, t) for b, t in sizes if b * t > 256 and b > 1]
    assert not over, (over, sizes)
    # batched otherwise: float32 batching noise only (SAME_BATCH, module docstring, bounds the
    # path difference; the batching noise measured by test_other_batchings... is below 1e-6);
    # 1e-4 is over 100 times that, and a wrong row or text moves whole vectors
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("save", [save_pylate, save_sentence_transformers])
def test_the_query_token_cap_is_the_exported_one(natives, tmp_path, save):
    # PyLateEncoder reported 64 whatever cap the export used (a server tells clients this value)
    native = natives["uibk"]
    cap = native.query_token_cap
    try:
        native.query_token_cap = 5
        folder = save(native, tmp_path / "cap5")
    finally:
        native.query_token_cap = cap
    enc = load_encoder(folder, trust_remote_code=True, device="cpu")
    assert enc.query_token_cap == 5
    assert enc.encode_queries(["lift " * 20])[0].shape == (3 + 5, 128)


def test_a_pylate_export_without_modules_json_is_refused(folders, tmp_path):
    # without modules.json the folder loaded as a plain Hugging Face model: random weights
    import shutil

    broken = shutil.copytree(folders["uibk_pylate"], tmp_path / "no-modules")
    (broken / "modules.json").unlink()
    with pytest.raises(ValueError, match=r"modules\.json"):
        load_encoder(broken, trust_remote_code=True, device="cpu")
