"""The embedded default's forward pass on ONNX Runtime (CPU): ``load_encoder(backend="onnx")``
(docs/loading.md, "ONNX backend"; the ``onnx`` extra).

The plain-torch BERT of :mod:`uibk_embedding.encoder.bert` is exported once with
``torch.onnx.export`` (TorchScript exporter, opset 17, dynamic batch and length) into
``$UIBK_CACHE/onnx`` (default ``~/.cache/uibk_embedding/onnx``), named by the model's content hash,
and checked against the torch pass on a probe batch before it is kept. :class:`OnnxBert` then
runs it with the same inputs and output as the torch module (last hidden states, float32), so the
rest of the pipeline -- pooling, the tagged construction, batching by token budget -- is unchanged
and the lists are those of the torch path within float32 noise (1e-5 is tested): a store indexed on
one backend is searched with the other.

Example
-------
A tiny random BERT, exported and run (the embedded default is exported the same way):

>>> import pathlib, tempfile, torch
>>> from uibk_embedding.encoder.bert import BertConfig, bert_encoder
>>> cfg = BertConfig(vocab_size=8000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
...                  intermediate_size=32, max_position_embeddings=16)
>>> net = bert_encoder(cfg).eval(); _ = torch.manual_seed(0)
>>> with torch.no_grad():
...     for p in net.parameters():
...         _ = p.normal_(std=0.2)
>>> path = export_bert(net, pathlib.Path(tempfile.mkdtemp()) / "tiny.onnx")
>>> ids = torch.tensor([[101, 7, 9, 102]]); mask = torch.ones_like(ids)
>>> with torch.no_grad():
...     want = net(ids, mask)
>>> bool(torch.allclose(OnnxBert(path)(ids, mask), want, atol=1e-5))
True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: what the exported graph may differ from the torch pass by on the probe batch before it is kept
EXPORT_TOLERANCE = 1e-4


def onnx_cache_dir() -> Path:
    """``$UIBK_CACHE/onnx`` (default ``~/.cache/uibk_embedding/onnx``).

    >>> onnx_cache_dir().name
    'onnx'
    """
    return Path(os.environ.get("UIBK_CACHE", Path.home() / ".cache" / "uibk_embedding")) / "onnx"


def require_onnxruntime() -> Any:
    """``onnxruntime``, or an ImportError naming the extra to install.

    >>> require_onnxruntime().__name__
    'onnxruntime'
    """
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError("backend='onnx' needs onnxruntime (and onnx to export the model once): "
                          "pip install 'uibk-embedding[onnx]'") from e
    return onnxruntime


def _always_masked(net: Any) -> Any:
    """``net`` as a module whose graph applies the attention mask whatever the example batch
    (the torch module skips it for an unpadded batch, a branch tracing would freeze)."""
    import torch

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            x = self.net.embeddings(input_ids, token_type_ids)
            mask = attention_mask.bool()[:, None, None, :]
            for layer in self.net.encoder.layer:
                x = layer(x, mask)
            return x

    return Masked().eval()


def _probe() -> dict[str, np.ndarray]:
    ids = np.array([[101, 7592, 2088, 1999, 1037, 2307, 102, 0, 0],
                    [101, 2009, 2003, 1037, 3231, 1997, 1996, 2088, 102]], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64),
            "token_type_ids": np.zeros_like(ids)}


def export_bert(net: Any, out: Path) -> Path:
    """Export the BERT ``net`` (:func:`~uibk_embedding.encoder.bert.load_bert`) to ``out`` (written
    to a temporary file, checked against ``net`` on a probe batch, then moved into place)."""
    import torch

    try:
        import onnx  # noqa: F401  (the TorchScript exporter writes through it)
    except ImportError as e:
        raise ImportError("exporting the model for backend='onnx' needs the onnx package: "
                          "pip install 'uibk-embedding[onnx]'") from e
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    probe = _probe()
    args = tuple(torch.from_numpy(probe[k]) for k in INPUTS)
    dynamic = {k: {0: "batch", 1: "tokens"} for k in (*INPUTS, "last_hidden_state")}
    import warnings

    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_always_masked(net), args, str(tmp), input_names=list(INPUTS),
                          output_names=["last_hidden_state"], dynamic_axes=dynamic,
                          opset_version=OPSET, dynamo=False)
        want = net(*args).numpy()
    try:
        got = OnnxBert(tmp, num_threads=1)(**{k: torch.from_numpy(v) for k, v in probe.items()}).numpy()
        keep = probe["attention_mask"].astype(bool)
        err = float(np.abs(got - want)[keep].max())
        if not err <= EXPORT_TOLERANCE:
            raise RuntimeError(f"the ONNX export differs from the torch model by {err:.2e} "
                               f"(more than {EXPORT_TOLERANCE}): not used")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def exported_model(net: Any, model_id: str) -> Path:
    """The cached ONNX file of the model whose content hash is ``model_id`` (exported from
    ``net`` the first time), per torch version and opset."""
    import torch

    out = onnx_cache_dir() / f"bert-{model_id}-torch{torch.__version__.split('+')[0]}-opset{OPSET}.onnx"
    if not out.is_file():
        export_bert(net, out)
    return out


class OnnxBert:
    """An ONNX Runtime session that is called as the torch BERT is: keyword inputs as CPU
    tensors, the last hidden states ``(B, T, hidden)`` as a float32 tensor.

    Parameters
    ----------
    path: the ``.onnx`` file.
    num_threads: intra-op threads of the session (None: onnxruntime's default, one per core).
    """

    def __init__(self, path: str | os.PathLike, num_threads: int | None = None) -> None:
        ort = require_onnxruntime()
        opts = ort.SessionOptions()
        if num_threads:
            opts.intra_op_num_threads = int(num_threads)
        opts.inter_op_num_threads = 1
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def __call__(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
        import torch

        ids = input_ids.cpu().numpy()
        feed = {"input_ids": ids, "attention_mask": attention_mask.cpu().numpy(),
                "token_type_ids": (np.zeros_like(ids) if token_type_ids is None
                                   else token_type_ids.cpu().numpy())}
        return torch.from_numpy(self.session.run(None, feed)[0])


__all__ = ["OnnxBert", "export_bert", "exported_model", "onnx_cache_dir", "require_onnxruntime"]
