"""The package's layers, read from the source (docs/architecture.md).

Every module of the import package ``uibk_embedding`` (each folder that ``pyproject.toml``
maps to a subpackage) is parsed, not imported, and its first-party imports are checked:

* upward: a layer imports only the layers below it (and itself);
* inside a function: a first-party import sits at module level, never in a function body
  (where it would hide a cycle between packages).

Layers, bottom up::

    ground floor  uibk_embedding (errors, tagged format, MaxSim and rerank, storage primitives)
    models        uibk_embedding.encoder
    stores        uibk_embedding.adapters, uibk_embedding.plaid_backend
    integrations  uibk_embedding.integrations (LangChain, LlamaIndex)
    testing       uibk_embedding.testing (harnesses: backend specs, local servers)
    apps          uibk_embedding.apps (CLI, readers, evaluation, compare, distributed)

Models and stores sit side by side: neither imports the other (stores read the tagged
format, which belongs to the ground floor).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "uibk_embedding"

# the layers a module of each layer may import (its own included)
GROUND = {"ground"}
MAY_IMPORT: dict[str, set[str]] = {
    "ground": GROUND,
    "encoder": GROUND | {"encoder"},
    "adapters": GROUND | {"adapters", "plaid_backend"},
    "plaid_backend": GROUND | {"adapters", "plaid_backend"},
    "integrations": GROUND | {"encoder", "adapters", "plaid_backend", "integrations"},
    "testing": GROUND | {"encoder", "adapters", "plaid_backend", "integrations", "testing"},
    "apps": GROUND | {"encoder", "adapters", "plaid_backend", "integrations", "testing", "apps"},
    # the package's own __init__ is its public face: it re-exports the store and encoder API
    # (open_store, load_encoder, ...). Importing any submodule runs it first, and it imports
    # nothing that imports it back at module level, so this is no cycle.
    "facade": GROUND | {"encoder", "adapters"},
}

# (module, imported module) pairs allowed although they break a rule above. Each says why.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
ALLOWED_IN_FUNCTION = {
    # optional or heavy third-party code behind a first-party module: loaded only when used
    ("uibk_embedding.encoder.pylate_model", "uibk_embedding.encoder.pylate_modules.tagged_modules"):
        "imports sentence-transformers 6 (the colbert extra)",
    # a model-folder file (copied into exports, imported there by sentence-transformers): the UIBK
    # architecture imports transformers' ModernBERT, which a one-model ("transformer") export skips
    ("uibk_embedding.encoder.pylate_modules.tagged_modules",
     "uibk_embedding.encoder.pylate_modules.uibk_architecture"): "ModernBERT only for a UIBK model",
    ("uibk_embedding.encoder.uibk", "uibk_embedding.encoder.pylate_modules.uibk_architecture"):
        "imports torch and transformers' ModernBERT (about 5 s): only when a UIBK model is built",
    # the one cycle left: TaggedEncoder.save_pylate (README: ``enc.save_pylate(folder)``) forwards
    # to the exporter, which needs the concrete encoder classes (UIBKEncoder, TransformerEncoder,
    # PyLateEncoder), all subclasses of TaggedEncoder. Removing the method would change the API.
    ("uibk_embedding.encoder.base", "uibk_embedding.encoder.pylate_model"): "TaggedEncoder.save_pylate",
}


def package_modules(repo: Path = REPO) -> dict[str, Path]:
    """Every module of the package, by dotted name, from the files under ``src/``.

    >>> mods = package_modules()
    >>> mods["uibk_embedding.apps.cli"].relative_to(REPO).as_posix()
    'src/uibk_embedding/apps/cli.py'
    """
    src = repo / "src"
    out: dict[str, Path] = {}
    for f in sorted((src / PACKAGE).rglob("*.py")):
        parts = f.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def layer(module: str) -> str:
    """The layer of a dotted module name.

    >>> layer("uibk_embedding.maxsim"), layer("uibk_embedding.encoder.base"), layer("uibk_embedding")
    ('ground', 'encoder', 'facade')
    """
    parts = module.split(".")
    if parts == [PACKAGE]:
        return "facade"
    if parts[1] in MAY_IMPORT and parts[1] not in ("ground", "facade"):
        return parts[1]
    return "ground"


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute name of a (possibly relative) ``from`` import."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def first_party_imports(module: str, path: Path, modules: set[str]) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` for each first-party import of a module.

    ``from pkg import name`` counts as importing ``pkg.name`` when that is one of ``modules``.
    """
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.stem == "__init__"
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names
                             if a.name.split(".")[0] == PACKAGE)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(module, is_pkg, child)
                if target.split(".")[0] == PACKAGE:
                    subs = [f"{target}.{a.name}" for a in child.names if f"{target}.{a.name}" in modules]
                    found.extend((t, child.lineno, in_function) for t in (subs or [target]))
            visit(child, inside)

    visit(tree, False)
    return found


def _is_type_checking_only(path: Path, line: int) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            if any(n.lineno <= line <= n.end_lineno for n in node.body):
                return True
    return False


def violations(repo: Path = REPO) -> tuple[list[str], list[str]]:
    """Upward imports and function-level first-party imports, one line each (file:line)."""
    upward, in_function = [], []
    mods = package_modules(repo)
    for module, path in mods.items():
        where = path.relative_to(repo).as_posix()
        for target, line, inside in first_party_imports(module, path, set(mods)):
            if inside:
                if (module, target) not in ALLOWED_IN_FUNCTION:
                    in_function.append(f"{where}:{line}: imports {target} inside a function")
                continue
            mine, theirs = layer(module), layer(target)
            if theirs in MAY_IMPORT[mine] or _is_type_checking_only(path, line):
                continue
            if (mine, target) in ALLOWED_UPWARD:
                continue
            upward.append(f"{where}:{line}: {mine} imports {target} ({theirs})")
    return upward, in_function


def test_every_module_is_read() -> None:
    mods = package_modules()
    assert {"uibk_embedding.apps.cli", "uibk_embedding.testing.specs", "uibk_embedding.maxsim",
            "uibk_embedding.adapters.base", "uibk_embedding.encoder.base"} <= set(mods)
    assert not {m for m in mods if layer(m) == "ground" and m.count(".") > 1}


def test_no_upward_imports() -> None:
    upward, _ = violations()
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_first_party_import_inside_a_function() -> None:
    _, inside = violations()
    assert not inside, ("first-party imports inside functions (import at module level; a cycle "
                        "means something belongs one layer lower):\n" + "\n".join(inside))


@pytest.mark.parametrize("source, upward, inside", [
    ("def f():\n    from uibk_embedding.adapters import open_store\n",
     [], ["src/uibk_embedding/bad.py:2: imports uibk_embedding.adapters inside a function"]),
    ("from uibk_embedding.apps.cli import main\n",
     ["src/uibk_embedding/bad.py:1: ground imports uibk_embedding.apps.cli (apps)"], []),
    ("from uibk_embedding import apps\n",
     ["src/uibk_embedding/bad.py:1: ground imports uibk_embedding.apps (apps)"], []),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from uibk_embedding.apps import cli\n",
     [], []),
])
def test_the_check_catches(tmp_path: Path, source: str, upward: list[str], inside: list[str]) -> None:
    """A ground-floor module with a bad import is reported (the checker itself works)."""
    pkg = tmp_path / "src" / PACKAGE
    for folder in ("", "adapters", "apps"):
        (pkg / folder).mkdir(parents=True, exist_ok=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "apps" / "cli.py").write_text("")
    (pkg / "bad.py").write_text(source)
    assert violations(tmp_path) == (upward, inside)


def test_a_plain_checkout_imports_from_src() -> None:
    """The standard ``src/`` layout: the package is one folder tree, so a checkout imports with
    ``src`` on the path and nothing mapped (no package-dir in ``pyproject.toml``)."""
    code = ("import sys; sys.path.insert(0, 'src'); import uibk_embedding.adapters.base as b, "
            "uibk_embedding.plaid_backend.store; print(b.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == REPO / "src" / "uibk_embedding" / "adapters" / "base.py"
    assert "package-dir" not in (REPO / "pyproject.toml").read_text()
