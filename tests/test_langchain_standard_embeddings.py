"""langchain-tests' standard embeddings suites on UIBKDenseEmbeddings (the encoder's dense head as
a LangChain ``Embeddings``); the vector-store and retriever suites run in tests/test_langchain.py.
The package's other suites (chat models, tools, caches, byte stores, DocumentIndex, sandboxes)
test interfaces this library does not implement."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")

from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

import uibk_embedding as ue
from uibk_embedding.integrations.langchain import UIBKDenseEmbeddings

# the suites' async tests carry no marker of their own: run them with anyio (asyncio backend)
pytestmark = pytest.mark.anyio

_ENCODER = None


def _params() -> dict:
    global _ENCODER
    if _ENCODER is None:
        _ENCODER = ue.load_encoder()
    return {"encoder": _ENCODER}


class TestUIBKDenseEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[UIBKDenseEmbeddings]:
        return UIBKDenseEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return _params()


class TestUIBKDenseEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[UIBKDenseEmbeddings]:
        return UIBKDenseEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return _params()
