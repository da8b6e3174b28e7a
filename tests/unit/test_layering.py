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


def sibling_imports(path: Path) -> set[str]:
    """Modules of the same package that ``path`` imports (``from .x import``), at the
    top or inside functions."""
    return {
        node.module.split(".")[0]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }


def test_the_data_modules_import_each_other_without_a_circle():
    """The reader of a converted directory once imported its writer's manifest, and the
    xyz reader the directory reader: the layout now lives apart (layout.py), and one
    module (reading.py) dispatches to both readers."""
    graph = {path.stem: sibling_imports(path) for path in (PACKAGE / "data").glob("*.py")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for module in graph.get(start, ()):
            if module == goal or (module not in seen and reaches(module, goal, seen | {module})):
                return True
        return False

    circles = sorted(module for module in graph if reaches(module, module, {module}))
    assert circles == []
    assert "layout" in graph["memmap"] and "convert" not in graph["memmap"]


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
    from atomtrain.models import registry

    architecture_packages = {
        PACKAGE / "models" / module.split(".")[-1] for module in registry.PACKAGES.values()
    }
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


def test_every_architectures_options_are_checked_without_importing_torch():
    """``atomtrain train`` checks an options file before torch's import (1.5-2 s), so
    a mistake in it is said at once: the options modules, the architecture packages'
    ``__init__`` and ``options`` modules and the registry's lookups of them import no
    torch, for every registered architecture."""

    from atomtrain.models import registry

    script = (
        "import sys\n"
        "from atomtrain.models import registry\n"
        "from atomtrain.options import parse_options\n"
        "for name in registry.known():\n"
        "    parse_options({'architecture': {'name': name}, 'training_set': 'x.xyz'}, 'o.yaml')\n"
        "    registry.training_defaults(name), registry.start_file_key(name)\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'torch'))\n"
    )
    assert printed_by_a_new_python(script) == "[]"
    assert len(registry.known()) >= 3


def test_a_soap_bpnn_run_imports_neither_ases_readers_nor_scipys_heavy_parts():
    """What a SOAP-BPNN run on a file read before imports (the training command, the
    trainer, the model, the export): not ASE's readers (0.5 s with what they import,
    when the data cache holds the file: data/remembered.py), nor scipy's spatial or
    optimize packages (0.2-0.3 s each), which only PET's augmentation uses, nor
    scipy.special (0.13 s; SOAP's radial basis writes out the Bessel functions it needs)."""
    script = (
        "import sys\n"
        "import atomtrain.cli.train_run, atomtrain.training.loop, atomtrain.models.export\n"
        "import atomtrain.data.reading, atomtrain.models.soap_bpnn.model\n"
        "heavy = ('ase.io', 'scipy.spatial', 'scipy.optimize', 'scipy.integrate',\n"
        "         'scipy.special')\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    assert printed_by_a_new_python(script) == "[]"


def test_the_reader_of_files_alongside_a_commands_imports_needs_no_torch():
    """data/ahead.py's child reads a file while the command imports torch: its modules
    import without torch (vesin's optional import of it is refused there)."""
    script = (
        "import sys\nfrom atomtrain.runtime import unimported\n"
        "with unimported('torch', 'cupy'):\n"
        "    import atomtrain.data.ahead, atomtrain.data.extxyz\n"
        "print('torch' in sys.modules)\n"
    )
    assert printed_by_a_new_python(script) == "False"


def printed_by_a_new_python(script: str) -> str:
    """What ``script`` prints in a Python process of its own (nothing imported before)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
