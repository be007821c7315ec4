"""A test may skip for a missing optional extra, and for nothing else: ``pytest.importorskip``
(through tests/conftest.py) and :func:`uibk_embedding.testing.open_spec` fail on a broken import
(an installed module whose own import fails, a missing core dependency, this package's own
modules) instead of hiding it as a skip."""

from __future__ import annotations

from pathlib import Path

import pytest

from uibk_embedding.testing import BackendSpec, open_spec


def _module(folder: Path, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(body)
    return name


def test_importorskip_skips_for_a_missing_extra_only(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = _module(tmp_path, "uibk_t_needs_extra",
                    "raise ModuleNotFoundError(\"No module named 'qdrant_client'\", name='qdrant_client')\n")
    with pytest.raises(pytest.skip.Exception):
        pytest.importorskip(extra)
    broken = _module(tmp_path, "uibk_t_broken", "from json import no_such_name\n")
    core = _module(tmp_path, "uibk_t_core_missing", "import uibk_t_no_such_core_dependency\n")
    own = _module(tmp_path, "uibk_t_own_missing", "import uibk_embedding.no_such_module\n")
    for name in (broken, core, own):
        with pytest.raises(ImportError, match="not because an optional extra is missing"):
            pytest.importorskip(name)
    assert pytest.importorskip("json").__name__ == "json"


def test_open_spec_skips_for_a_missing_extra_only(tmp_path):
    def needs_extra(d):
        raise ModuleNotFoundError("No module named 'xtr_warp'", name="xtr_warp")

    def broken(d):
        raise ModuleNotFoundError("No module named 'uibk_embedding.adapters.gone'",
                                  name="uibk_embedding.adapters.gone")

    with pytest.raises(pytest.skip.Exception, match="optional extra"):
        open_spec(BackendSpec("needs-extra", make=needs_extra), tmp_path)
    with pytest.raises(ModuleNotFoundError, match=r"adapters\.gone"):
        open_spec(BackendSpec("broken", make=broken), tmp_path)


def test_require_names_the_extra_only_when_the_package_is_missing(tmp_path, monkeypatch) -> None:
    """``require`` says "install the extra" for a package that is not there, but an installed
    package whose own import fails (something it needs is gone) is raised as it is: a broken
    install must not read as a missing extra (and so never turn into a test skip)."""
    from uibk_embedding._optional import require
    from uibk_embedding.errors import MissingDependency

    (tmp_path / "uibk_broken_pkg").mkdir()
    (tmp_path / "uibk_broken_pkg" / "__init__.py").write_text("import uibk_gone_inner_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        require("uibk_broken_pkg", "serve")
    assert e.value.name == "uibk_gone_inner_module" and not isinstance(e.value, MissingDependency)
    with pytest.raises(MissingDependency, match=r"uibk-embedding\[serve\]"):
        require("uibk_package_not_installed_xyz", "serve")
