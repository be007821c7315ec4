"""The embedded default's forward pass on ONNX Runtime or OpenVINO (CPU):
``load_encoder(backend="onnx" | "openvino" | "openvino-bf16")`` (docs/loading.md, "CPU
backends"; the ``onnx`` extra, and OpenVINO for the latter two).

The plain-torch BERT of :mod:`uibk_embedding.encoder.bert` is exported once with
``torch.onnx.export`` (TorchScript exporter, opset 17, dynamic batch and length; attention written
out as transformers' eager BERT writes it) into ``$UIBK_CACHE/onnx`` (default
``~/.cache/uibk_embedding/onnx``), named by the model's content hash and the versions that wrote
it, and checked against the torch pass on a probe batch before it is kept; the same inputs give
the same file. For ONNX Runtime the graph is first fused by onnxruntime's transformer optimizer
(one ``Attention`` node per layer, ``SkipLayerNormalization``, ``BiasGelu``: :func:`fuse_bert`);
OpenVINO compiles the plain graph itself. :class:`OnnxBert` and :class:`OpenVinoBert` then run it
with the same inputs and output as the torch module (last hidden states, float32), so the rest of
the pipeline -- pooling, the tagged construction, batching by token budget -- is unchanged:
``onnx`` and ``openvino`` give the lists of the torch path within float32 noise (1e-5 is tested),
``openvino-bf16`` computes in bfloat16 where the CPU does so natively (avx512_bf16, AMX) and in
float32 elsewhere. A store indexed on one backend is searched with another.

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
import threading
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: what an exported graph may differ from the torch pass by on the probe batch before it is kept
EXPORT_TOLERANCE = 1e-4
#: the export's own version (a change of graph gets a new cache file): 2 = attention written out
EXPORT_VERSION = 2
#: the embedded default's encoding backends: torch, its BERT on ONNX Runtime (float32), on
#: OpenVINO (float32; bfloat16 where the CPU computes it natively)
BACKENDS = ("torch", "onnx", "openvino", "openvino-bf16")


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


def _explicit_attention(net: Any) -> Any:
    """``net`` as a module for export: attention written out as transformers' eager BERT writes
    it (``softmax(q k^T / sqrt(d) + (1 - mask) * -10000) v``), so that onnxruntime's transformer
    optimizer recognises each layer and fuses it into one ``Attention`` node; the mask applied
    whatever the example batch (the torch module skips it for an unpadded batch, a branch tracing
    would freeze). The same network: its states agree with the torch module's within float32 noise
    (the export is checked, :data:`EXPORT_TOLERANCE`)."""
    import math

    import torch
    from torch.nn import functional as F

    class Explicit(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            x = self.net.embeddings(input_ids, token_type_ids)
            masked = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.net.encoder.layer:
                att, n = layer.attention["self"], layer.heads
                d = x.shape[-1] // n

                def heads(lin: torch.nn.Module, x: torch.Tensor = x, n: int = n, d: int = d) -> torch.Tensor:
                    y = lin(x)
                    return y.view((*y.size()[:-1], n, d)).permute(0, 2, 1, 3)

                scores = torch.matmul(heads(att["query"]), heads(att["key"]).transpose(-1, -2))
                probs = torch.softmax(scores / math.sqrt(d) + masked, dim=-1)
                ctx = torch.matmul(probs, heads(att["value"])).permute(0, 2, 1, 3).contiguous()
                ctx = ctx.view((*ctx.size()[:-2], n * d))
                out = layer.attention["output"]
                x = out["LayerNorm"](out["dense"](ctx) + x)
                ff = layer.output["dense"](F.gelu(layer.intermediate["dense"](x)))
                x = layer.output["LayerNorm"](ff + x)
            return x

    return Explicit().eval()


def _probe() -> dict[str, np.ndarray]:
    ids = np.array([[101, 7592, 2088, 1999, 1037, 2307, 102, 0, 0],
                    [101, 2009, 2003, 1037, 3231, 1997, 1996, 2088, 102]], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64),
            "token_type_ids": np.zeros_like(ids)}


def fuse_bert(src: Path, dst: Path, num_heads: int, hidden_size: int, layers: int) -> bool:
    """onnxruntime's transformer optimizer on the exported graph ``src``, written to ``dst``: each
    layer's attention one ``Attention`` node (the raw 2-D mask, any padding side), residual +
    LayerNorm ``SkipLayerNormalization``, bias + GELU ``BiasGelu``; no graph-level rewrite of
    onnxruntime's own (``opt_level=0``: the file depends on the optimizer's code only, so it is
    the same on every CPU). Returns False, writing nothing, when the optimizer is missing or
    does not fuse every layer's attention (the unfused graph is then used: slower, the same
    numbers).

    >>> fuse_bert(Path("missing.onnx"), Path("out.onnx"), 12, 384, 6)
    False
    """
    if not src.is_file():
        return False
    try:
        import logging

        from onnxruntime.transformers import optimizer
        from onnxruntime.transformers.fusion_options import FusionOptions
    except ImportError:
        return False
    options = FusionOptions("bert")
    options.use_raw_attention_mask(True)
    quiet = logging.getLogger("onnxruntime.transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        model = optimizer.optimize_model(str(src), model_type="bert", num_heads=num_heads,
                                         hidden_size=hidden_size, optimization_options=options,
                                         opt_level=0, use_gpu=False)
    finally:
        quiet.setLevel(level)
    fused = model.get_fused_operator_statistics()
    if fused.get("Attention", 0) != layers:
        return False
    model.save_model_to_file(str(dst))
    return True


def _check(run: Any, want: np.ndarray, probe: dict[str, np.ndarray], what: str) -> None:
    """Refuse a graph whose states on the probe batch differ from the torch module's by more
    than :data:`EXPORT_TOLERANCE`."""
    import torch

    got = run(**{k: torch.from_numpy(v) for k, v in probe.items()}).numpy()
    keep = probe["attention_mask"].astype(bool)
    err = float(np.abs(got - want)[keep].max())
    if not err <= EXPORT_TOLERANCE:
        raise RuntimeError(f"the {what} differs from the torch model by {err:.2e} "
                           f"(more than {EXPORT_TOLERANCE}): not used")


def export_bert(net: Any, out: Path, fuse: bool = True) -> Path:
    """Export the BERT ``net`` (:func:`~uibk_embedding.encoder.bert.load_bert`) to ``out``: traced
    with attention written out (:func:`_explicit_attention`) and, for ONNX Runtime (``fuse``),
    fused (:func:`fuse_bert`); written to temporary files, checked against ``net`` on a probe
    batch (by onnxruntime; the plain graph by OpenVINO when onnxruntime is missing), then moved
    into place."""
    import torch

    try:
        import onnx  # noqa: F401  (the TorchScript exporter writes through it)
    except ImportError as e:
        raise ImportError("exporting the model for backend='onnx' or 'openvino' needs the onnx package: "
                          "pip install 'uibk-embedding[onnx]'") from e
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}.{threading.get_ident()}"
    traced, fused = (out.with_name(f"{out.name}.{tag}.{k}.tmp") for k in ("traced", "fused"))
    probe = _probe()
    args = tuple(torch.from_numpy(probe[k]) for k in INPUTS)
    dynamic = {k: {0: "batch", 1: "tokens"} for k in (*INPUTS, "last_hidden_state")}
    cfg = net.config
    import warnings

    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(_explicit_attention(net), args, str(traced), input_names=list(INPUTS),
                              output_names=["last_hidden_state"], dynamic_axes=dynamic,
                              opset_version=OPSET, dynamo=False)
            want = net(*args).numpy()
        graph = traced
        if fuse and fuse_bert(traced, fused, cfg.num_attention_heads, cfg.hidden_size, cfg.num_hidden_layers):
            graph = fused
        try:
            require_onnxruntime()
            run: Any = OnnxBert(graph, num_threads=1)
        except ImportError:  # the plain graph for OpenVINO, onnxruntime not installed
            if fuse:
                raise
            run = OpenVinoBert(graph, num_threads=1)
        _check(run, want, probe, "ONNX export")
        os.replace(graph, out)
    finally:
        for tmp in (traced, fused):
            tmp.unlink(missing_ok=True)
    return out


def exported_model(net: Any, model_id: str, backend: str = "onnx") -> Path:
    """The cached ONNX file for ``backend`` (``"onnx"``: fused for ONNX Runtime; ``"openvino"``,
    ``"openvino-bf16"``: the plain graph, standard operators only) of the model whose content
    hash is ``model_id`` (exported from ``net`` the first time), per torch, onnxruntime and opset
    version (the exporter and the optimizer write it).

    >>> exported_model(None, "0", backend="int8")
    Traceback (most recent call last):
    ...
    ValueError: backend must be one of 'torch', 'onnx', 'openvino', 'openvino-bf16'; got 'int8'
    """
    if backend not in BACKENDS[1:]:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    import torch

    stem = f"bert-{model_id}-torch{torch.__version__.split('+')[0]}-opset{OPSET}-v{EXPORT_VERSION}"
    if backend == "onnx":
        out = onnx_cache_dir() / f"{stem}-ort{require_onnxruntime().__version__}-fused.onnx"
    else:
        out = onnx_cache_dir() / f"{stem}-plain.onnx"
    if not out.is_file():
        export_bert(net, out, fuse=backend == "onnx")
    return out


def backend_network(net: Any, model_id: str, backend: str, num_threads: int | None = None) -> Any:
    """What runs the forward pass of the embedded default's ``net`` for ``backend`` (not
    ``"torch"``): an :class:`OnnxBert` or :class:`OpenVinoBert` of its cached export, called as
    ``net`` is.

    >>> backend_network(None, "0", "torch")
    Traceback (most recent call last):
    ...
    ValueError: backend 'torch' runs the torch module itself
    """
    if backend == "torch":
        raise ValueError("backend 'torch' runs the torch module itself")
    if backend == "onnx":
        require_onnxruntime()
        return OnnxBert(exported_model(net, model_id, backend), num_threads=num_threads)
    require_openvino()
    return OpenVinoBert(exported_model(net, model_id, backend), num_threads=num_threads,
                        bf16=backend == "openvino-bf16")


def require_openvino() -> Any:
    """``openvino``, or an ImportError naming what to install.

    >>> try:
    ...     found = require_openvino().__name__ == "openvino"
    ... except ImportError as e:
    ...     found = "uibk-embedding[openvino]" in str(e)
    >>> found
    True
    """
    try:
        import openvino
    except ImportError as e:
        raise ImportError("backend='openvino' needs OpenVINO (and onnx to export the model once): "
                          "pip install 'uibk-embedding[openvino]'") from e
    return openvino


def native_bf16(core: Any = None) -> bool:
    """Whether OpenVINO's CPU plugin computes bfloat16 natively on this CPU (avx512_bf16 or AMX:
    ``BF16`` among its optimization capabilities); without it ``openvino-bf16`` runs float32."""
    ov = require_openvino()
    core = core or ov.Core()
    return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


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


class OpenVinoBert:
    """An OpenVINO CPU model compiled from the plain ONNX export, called as the torch BERT is.

    Parameters
    ----------
    path: the ``.onnx`` file (standard operators: :func:`exported_model` for ``"openvino"``).
    num_threads: inference threads (None: OpenVINO's default, one per core).
    bf16: compute in bfloat16 (``INFERENCE_PRECISION_HINT``) where the CPU does so natively
        (:func:`native_bf16`); elsewhere, and without it, float32 (the torch path's numbers
        within float32 noise). :attr:`precision` says which ran.
    """

    def __init__(self, path: str | os.PathLike, num_threads: int | None = None, bf16: bool = False) -> None:
        ov = require_openvino()
        core = ov.Core()
        self.path = Path(path)
        self.precision = "bf16" if bf16 and native_bf16(core) else "f32"
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self.precision, "PERFORMANCE_HINT": "LATENCY"}
        if num_threads:
            config["INFERENCE_NUM_THREADS"] = int(num_threads)
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self._lock = threading.Lock()  # one inference request, one caller at a time

    def __call__(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
        import torch

        ids = input_ids.cpu().numpy()
        feed = {"input_ids": ids, "attention_mask": attention_mask.cpu().numpy(),
                "token_type_ids": (np.zeros_like(ids) if token_type_ids is None
                                   else token_type_ids.cpu().numpy())}
        with self._lock:
            out = self.compiled(feed)[0]
        return torch.from_numpy(np.array(out, dtype=np.float32, copy=True))


__all__ = ["BACKENDS", "OnnxBert", "OpenVinoBert", "backend_network", "export_bert", "exported_model",
           "fuse_bert", "native_bf16", "onnx_cache_dir", "require_onnxruntime", "require_openvino"]
