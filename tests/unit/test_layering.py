"""The package's layers: distributed/ and data/ do not reach up into training/ or the
command line, so each can be used (and tested) below them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "atomtrain"


def imported_modules(path: Path) -> set[str]:
    """Relative imports of ``path`` resolved to atomtrain's top-level subpackages."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "atomtrain" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize(
    "layer, forbidden",
    [("distributed", {"training", "cli", "models"}), ("data", {"training", "cli", "distributed"})],
)
def test_lower_layers_do_not_import_upper_ones(layer, forbidden):
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(imported_modules(path) & forbidden)
        for path in (PACKAGE / layer).glob("*.py")
        if imported_modules(path) & forbidden
    }
    assert offenders == {}
    assert list((PACKAGE / layer).glob("*.py"))  # the layer is where the test looks


def architecture_imports(path: Path) -> list[str]:
    """Imports of ``path`` that name an architecture package (models.soap_bpnn, ...)."""
    from atomtrain.models import registry

    packages = {module.split(".")[-1] for module in registry.PACKAGES.values()}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [name for name in names if set(name.split(".")) & packages]
    return found


def test_only_architecture_packages_and_tests_name_an_architecture(tmp_path):
    """The trainer, eval, export, checkpoints and fine-tuning reach architectures through
    the registry: a new architecture is its package and one line there."""
    architecture_packages = {PACKAGE / "models" / name for name in ("soap_bpnn", "mace")}
    checked = [
        path
        for path in PACKAGE.rglob("*.py")
        if not any(package in path.parents for package in architecture_packages)
    ]
    offenders = {
        str(path.relative_to(PACKAGE)): architecture_imports(path)
        for path in checked
        if architecture_imports(path)
    }
    assert offenders == {}
    assert len(checked) > 30
    offending = tmp_path / "offending.py"  # what the check would catch
    offending.write_text(
        "from ..models.soap_bpnn.model import SoapBpnn\nimport atomtrain.models.mace\n"
    )
    assert len(architecture_imports(offending)) == 3
