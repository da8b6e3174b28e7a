"""Export a model as a metatomic model, and load it (or an older atomtrain export) back.

The exported file is a metatomic ``AtomisticModel``: MD engines (ASE through
metatomic-ase, i-PI, LAMMPS, TorchSim) load it and compute forces, stress and virials
by autograd. The torch extension it needs (sphericart's operator) is collected beside
it in ``extensions/``; the model's own hyperparameters ride in the metadata's ``extra``
so that it can be fine-tuned.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import site
import sys
import types
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import AtomtrainError
from ..io import atomic_save_with_directory
from ..runtime import runs_one_command, unimported
from . import adapters, registry
from .energy_model import EnergyModel, ensemble_name, uncertainty_name

# the model's hyperparameters, stored beside the TorchScript code (which does not keep
# them) so that an exported model can be fine-tuned
HYPERS_FILE = "atomtrain_hypers.json"
# the composition directions the baseline was fitted along (see SoapBpnn.baseline_span)
BASELINE_SPAN_FILE = "atomtrain_baseline_span.json"
# where metatomic models keep their metadata, and the keys of atomtrain's in its extra
METADATA_FILE = "model-metadata"
EXTRA_KEYS = {HYPERS_FILE: "atomtrain-hypers", BASELINE_SPAN_FILE: "atomtrain-baseline-span"}
EXTENSIONS_DIRECTORY = "extensions"


# metatensor-torch's optional Python layers, which metatomic does not use
METATENSOR_PYTHON_LAYERS = ("metatensor_operations", "metatensor_learn")


def metatomic_torch(last_use: bool = False) -> types.ModuleType:
    """metatomic.torch, its TorchScript classes registered; imported without IPython,
    which metatensor-torch imports only to serve a running one (runtime.unimported).
    ``last_use``: nothing after this in the command imports metatrain (whose code calls
    metatensor's operations); in a process that ends with its command, metatensor's
    operations and learn layers are then left out (runtime.unimported)."""
    lean = last_use and runs_one_command()
    with unimported("IPython", *(METATENSOR_PYTHON_LAYERS if lean else ())):
        import metatomic.torch

    return metatomic.torch


def output_unit_problem(unit: str) -> str | None:
    """Why metatomic, which the export hands every output's unit to, refuses ``unit``,
    or None: asked before training, not found at its end."""
    try:
        metatomic_torch().ModelOutput(unit=unit)
    except (RuntimeError, ValueError) as error:
        return first_line(error)
    return None


def atomistic_model(model: EnergyModel):
    """``model`` as a metatomic AtomisticModel, in eval mode on CPU."""
    metatomic = metatomic_torch(last_use=True)  # an export ends the train and export commands
    from .metatomic_wrapper import MetatomicEnergy

    model = adapters.merged(model)  # engines get the plain architecture
    architecture = registry.architecture_of(model.hypers)
    specs = model.target_specs()
    inner = architecture.script(copy.deepcopy(model).cpu().eval())
    outputs = {}
    for name in model.energy_names:  # "energy" and its variants, "energy/<variant>"
        outputs[name] = metatomic.ModelOutput(
            quantity="",  # deprecated: metatomic reads the dimension from the unit
            unit=model.energy_unit,
            sample_kind="atom",  # per system by default, per atom on request
            description="potential energy"
            + ("" if name == "energy" else f" ({name.removeprefix('energy/')})"),
        )
    units = {spec.name: spec.unit for spec in specs}
    for name in model.uncertainty_outputs():
        outputs[uncertainty_name(name)] = metatomic.ModelOutput(
            quantity="",
            unit=units.get(name, model.energy_unit),
            sample_kind="atom",  # per system by default, per atom on request
            description="LLPR uncertainty of "
            + ("the potential energy" if name == "energy" else name)
            + " (one standard deviation)",
        )
    for name in model.ensemble_outputs():
        outputs[ensemble_name(name)] = metatomic.ModelOutput(
            quantity="",
            unit=model.energy_unit,
            sample_kind="atom",  # per system by default, per atom on request
            description=f"LLPR ensemble of {name} (last-layer weights sampled)",
        )
    for spec in specs:
        outputs[spec.name] = metatomic.ModelOutput(
            quantity="",
            unit=spec.unit,
            sample_kind="atom",  # per-structure targets: per atom on request
            description=spec.description or spec.quantity or spec.name,
        )
    capabilities = metatomic.ModelCapabilities(
        outputs=outputs,
        atomic_types=[int(z) for z in model.atomic_types],
        interaction_range=float(model.cutoff),
        length_unit=model.length_unit,
        supported_devices=["cpu", "cuda"],
        # engines pass float64 positions; the features run in the training precision
        # and the energies are summed in float64
        dtype="float64",
    )
    trained_on = getattr(model, "trained_on", "") or "training data not recorded"
    metadata = metatomic.ModelMetadata(
        name=f"atomtrain {architecture.display_name}",
        description=(
            f"{architecture.display_name} interatomic potential trained with atomtrain; "
            f"{trained_on}"
        ),
        references=architecture.references,
        extra={
            EXTRA_KEYS[HYPERS_FILE]: json.dumps(getattr(model, "hypers", {})),
            EXTRA_KEYS[BASELINE_SPAN_FILE]: json.dumps(getattr(model, "baseline_span", None)),
        },
    )
    wrapper = MetatomicEnergy(inner, specs, list(model.energy_names))
    return metatomic.AtomisticModel(wrapper.eval(), metadata, capabilities)


def export(model: EnergyModel, path: str | Path) -> None:
    """Write ``model`` as a metatomic model to ``path``, atomically, with the torch
    extensions it needs collected in ``extensions/`` beside it."""
    architecture = registry.architecture_of(model.hypers)
    architecture.load_extensions()  # collected beside the model

    path = Path(path)
    with warnings.catch_warnings():
        # TorchScript is deprecated in recent torch, but it is what engines load; the
        # warning is not actionable for users, nor are e3nn's about its annotations
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", "The TorchScript type system", UserWarning)
        exported = atomistic_model(model)
        with only_extensions(architecture.extensions), import_roots_as_site_packages():
            atomic_save_with_directory(
                path,
                lambda file, extensions: exported.save(
                    str(file), collect_extensions=str(extensions)
                ),
                path.parent / EXTENSIONS_DIRECTORY,
                what="model",
            )


def copy_export(source: Path, path: str | Path) -> None:
    """Put an exported model (``source``, with its extensions beside it) at ``path`` too,
    atomically as export writes one: the same bytes, without scripting the model again
    (1 s for SOAP-BPNN)."""
    path = Path(path)
    extensions = source.parent / EXTENSIONS_DIRECTORY

    def save(file: Path, folder: Path) -> None:
        shutil.copyfile(source, file)
        if extensions.is_dir():
            shutil.copytree(extensions, folder)

    atomic_save_with_directory(path, save, path.parent / EXTENSIONS_DIRECTORY, what="model")


@contextlib.contextmanager
def import_roots_as_site_packages() -> Iterator[None]:
    """metatomic collects an extension library at its path relative to site-packages;
    one imported from anywhere else (PYTHONPATH, ``pip install --target``, a cluster's
    module system) would be copied onto itself, which it refuses. For the time of the
    export, the sys.path entries that hold a loaded library count as site-packages, so
    it is collected at its path relative to its import root, as an engine expects."""
    original = site.getsitepackages
    sites = [os.path.realpath(prefix) for prefix in original()]
    entries = [os.path.realpath(entry) for entry in sys.path if entry and os.path.isdir(entry)]
    roots = []
    for library in torch.ops.loaded_libraries:
        library = os.path.realpath(library)
        if deepest_folder_holding(library, sites) is None:
            root = deepest_folder_holding(library, entries)
            if root is not None and root not in roots:
                roots.append(root)
    site.getsitepackages = lambda *arguments: original(*arguments) + roots
    try:
        yield
    finally:
        site.getsitepackages = original


@contextlib.contextmanager
def only_extensions(names: tuple[str, ...]) -> Iterator[None]:
    """metatomic records every torch extension loaded in the process as one the model
    needs, and an engine then warns that it cannot load them: for the time of the
    export, the loaded libraries are those whose file names one of ``names``."""
    loaded = torch.ops.loaded_libraries
    torch.ops.loaded_libraries = {
        library for library in loaded if any(name in Path(library).name for name in names)
    }
    try:
        yield
    finally:
        torch.ops.loaded_libraries = loaded


def deepest_folder_holding(path: str, folders: list[str]) -> str | None:
    holding = [folder for folder in folders if path.startswith(folder.rstrip(os.sep) + os.sep)]
    return max(holding, key=len, default=None)


@contextlib.contextmanager
def unspecialized_on_cpu(device: torch.device) -> Iterator[None]:
    """TorchScript's profiling executor specializes a model's graph to the shapes of its
    first calls (twice, then up to ten times) in order to fuse operators; on a CPU it
    fuses none (torch's CPU fuser is off by default), so the specializations only cost
    time: seconds of MACE's and PET's first calls, none of the later ones'
    (docs/engines.md). The strategy is the process's: it is set for the call and
    restored."""
    if device.type != "cpu":
        yield
        return
    previous = fusion_strategy([("STATIC", 0), ("DYNAMIC", 0)])
    try:
        yield
    finally:
        fusion_strategy(previous)


def fusion_strategy(strategy: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """torch.jit.set_fusion_strategy without its deprecation warning at every call (torch
    2.13 deprecates TorchScript's API, which metatomic's models still run on)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.set_fusion_strategy(strategy)


def load_exported(
    path: str | Path,
    device: str | torch.device = "cpu",
    extra: dict[str, str] | None = None,
    last_use: bool = False,
) -> torch.jit.ScriptModule:
    """The model of an exported file: the metatomic model's inner EnergyModel (with its
    batched ``forward``), or an older atomtrain export. ``extra`` names what export
    stores beside the code (HYPERS_FILE, BASELINE_SPAN_FILE), filled in on return
    (empty when absent). ``last_use``: as for :func:`metatomic_torch` (``eval``)."""
    path = Path(path)
    if not path.exists():
        raise AtomtrainError(f"{path}: model file not found")
    foreign = foreign_file(path)
    if foreign is not None:
        raise AtomtrainError(f"{path}: {foreign}")
    kind = torch_file_kind(path)
    if kind == "other":
        raise AtomtrainError(f"{path}: not a model file (torch did not write it); {MODEL_INSTEAD}")
    if kind == "saved":
        raise AtomtrainError(
            f"{path}: a checkpoint, not an exported model; export it with 'atomtrain export "
            f"{path} -o model.pt' and give model.pt"
        )
    metadata = metatomic_metadata(path)
    if metadata is not None:
        metatomic_torch(last_use)  # its TorchScript classes are in the file
    hypers = json.loads((metadata or {}).get("extra", {}).get(EXTRA_KEYS[HYPERS_FILE]) or "{}")
    architecture = registry.architecture_of(hypers)  # exports before metatomic: SOAP-BPNN
    architecture.load_extensions()  # the operators and their autograd formulas
    architecture.check_device(torch.device(device))
    wanted = dict.fromkeys(extra or {}, "")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            model = torch.jit.load(str(path), map_location=device, _extra_files=wanted)
    except Exception as error:
        raise AtomtrainError(
            f"{path}: not an exported atomtrain model ({first_line(error)}); export a "
            "checkpoint with 'atomtrain export model.ckpt -o model.pt'"
        ) from error
    if metadata is not None:
        model = model.module.model
        stored = metadata.get("extra", {})
        wanted = {name: stored.get(key, "") for name, key in EXTRA_KEYS.items() if name in wanted}
    if extra is not None:
        extra.update({name: wanted.get(name, "") for name in extra})
    missing = [name for name in MODEL_ATTRIBUTES if not hasattr(model, name)]
    if missing:
        raise AtomtrainError(
            f"{path}: a TorchScript module, but not an atomtrain model (it has no "
            f"{', '.join(missing)}); give a model.pt written by atomtrain train or export"
        )
    return model


def metatomic_metadata(path: Path) -> dict | None:
    """The metadata of a metatomic model file (JSON), None for any other file."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [name for name in archive.namelist() if name.endswith(f"extra/{METADATA_FILE}")]
            return json.loads(archive.read(names[0])) if names else None
    except (zipfile.BadZipFile, OSError, KeyError, ValueError):
        return None


# what every exported atomtrain model carries, and eval, the calculator and fine-tuning use
MODEL_ATTRIBUTES = ("cutoff", "atomic_types")


def learnt_targets(model: torch.nn.Module) -> tuple[list[str], list[tuple[str, bool]]]:
    """(its energies, its mtt:: targets with whether each is per atom) of a model or a
    loaded export; an export written before there were targets learns "energy" only."""
    energies = list(getattr(model, "energy_names", ["energy"]))
    names = list(getattr(model, "target_names", []))
    per_atom = list(getattr(model, "per_atom_targets", []))
    return energies, list(zip(names, per_atom))


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def first_line(error: BaseException) -> str:
    """The first non-empty line of an error's message, without terminal colour codes:
    torch's loaders put paragraphs of advice and escape codes in theirs."""
    for line in ANSI_ESCAPE.sub("", str(error)).splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__


def torch_file_kind(path: Path) -> str:
    """ "model" (a TorchScript archive: model.pt), "saved" (torch.save's archive: a
    checkpoint), "archive" (a zip of neither kind, or truncated) or "other" (not a zip:
    a data file, an options file)."""
    try:
        with path.open("rb") as stream:
            if stream.read(4) != b"PK\x03\x04":
                return "other"
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return "archive"
    if any("/code/" in name for name in names):
        return "model"
    if any(name.endswith("data.pkl") for name in names):
        return "saved"
    return "archive"


MODEL_INSTEAD = "give the model.pt written by atomtrain train or export, or a checkpoint (.ckpt)"
CHECKPOINT_INSTEAD = (
    "give a checkpoint written by atomtrain train (the run's best.ckpt or last.ckpt)"
)


def pickle_header(path: str | Path) -> bytes | None:
    """The start of the pickle of a torch archive (empty when it holds none); None for
    a file that is not a zip archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [name for name in archive.namelist() if name.endswith("data.pkl")]
            return archive.read(pickles[0])[:100_000] if pickles else b""
    except (zipfile.BadZipFile, OSError, KeyError):
        return None


def foreign_file(path: Path) -> str | None:
    """What a model or checkpoint file written by another program is, with what to do
    about it; None for anything else (atomtrain's own files included).

    Both torch.save and TorchScript write zip archives; metatrain's checkpoints name
    their architecture and version in the pickle, and metatomic models written by
    others lack atomtrain's hyperparameters in their metadata."""
    header = pickle_header(path)
    if header is None:
        return None
    metadata = metatomic_metadata(path)
    if metadata is not None and EXTRA_KEYS[HYPERS_FILE] not in metadata.get("extra", {}):
        return (
            "a metatomic model (exported by metatrain or another metatomic tool), not an "
            "atomtrain model; run it with metatomic (metatomic-ase's MetatomicCalculator, "
            "LAMMPS, i-PI), or train it anew with atomtrain on the same options file"
        )
    # metatrain pickles its own classes (metatrain.utils...); a path with "metatrain" in
    # it (a user's directory) is no sign
    if b"model_ckpt_version" in header or b"metatrain.utils." in header:
        return (
            "a metatrain checkpoint: atomtrain starts from metatrain's PET checkpoints "
            "(architecture.training.finetune.read_from, atomtrain eval) and resumes only "
            "its own; train anew with atomtrain on the same options file (metatrain's "
            "format runs unchanged)"
        )
    return None
