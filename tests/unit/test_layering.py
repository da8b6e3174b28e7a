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
