"""Export a model to one TorchScript file and load it back without the training code.

The file needs ``sphericart.torch`` imported before loading: it provides the spherical
harmonics operator and registers its derivatives. :func:`load_exported` does that.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
import zipfile
from pathlib import Path

import torch

from ..errors import AtomtrainError
from ..io import atomic_write

# the model's hyperparameters, stored beside the TorchScript code (which does not keep
# them) so that an exported model can be fine-tuned
HYPERS_FILE = "atomtrain_hypers.json"
# the composition directions the baseline was fitted along (see SoapBpnn.baseline_span)
BASELINE_SPAN_FILE = "atomtrain_baseline_span.json"


def export(model: torch.nn.Module, path: str | Path) -> None:
    """Write ``model`` (eval mode, on CPU) as TorchScript to ``path``, atomically, with
    its hyperparameters."""
    exported = copy.deepcopy(model).cpu().eval()
    with warnings.catch_warnings():
        # TorchScript is deprecated in recent torch, but it is what loads without
        # Python code; the warning is not actionable for users
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(exported)
        extra = {
            HYPERS_FILE: json.dumps(getattr(model, "hypers", {})),
            BASELINE_SPAN_FILE: json.dumps(getattr(model, "baseline_span", None)),
        }
        atomic_write(
            path, lambda stream: torch.jit.save(scripted, stream, _extra_files=extra), what="model"
        )


def load_exported(
    path: str | Path, device: str | torch.device = "cpu", extra: dict[str, str] | None = None
) -> torch.jit.ScriptModule:
    """Load an exported model file; ``sphericart.torch`` is imported first. ``extra``
    names files stored beside the code, filled in on return (empty when absent)."""
    import sphericart.torch  # noqa: F401  (loads the operator and its autograd formulas)

    path = Path(path)
    if not path.exists():
        raise AtomtrainError(f"{path}: model file not found")
    foreign = foreign_file(path)
    if foreign is not None:
        raise AtomtrainError(f"{path}: {foreign}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            model = torch.jit.load(str(path), map_location=device, _extra_files=extra or {})
    except Exception as error:
        raise AtomtrainError(
            f"{path}: not an exported atomtrain model ({first_line(error)}); export a "
            "checkpoint with 'atomtrain export model.ckpt -o model.pt'"
        ) from error
    missing = [name for name in MODEL_ATTRIBUTES if not hasattr(model, name)]
    if missing:
        raise AtomtrainError(
            f"{path}: a TorchScript module, but not an atomtrain model (it has no "
            f"{', '.join(missing)}); give a model.pt written by atomtrain train or export"
        )
    return model


# what every exported atomtrain model carries, and eval, the calculator and fine-tuning use
MODEL_ATTRIBUTES = ("cutoff", "atomic_types")

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def first_line(error: BaseException) -> str:
    """The first non-empty line of an error's message, without terminal colour codes:
    torch's loaders put paragraphs of advice and escape codes in theirs."""
    for line in ANSI_ESCAPE.sub("", str(error)).splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__


def foreign_file(path: Path) -> str | None:
    """What a model or checkpoint file written by another program is, with what to do
    about it; None for anything else (atomtrain's own files included).

    Both torch.save and TorchScript write zip archives; metatrain's checkpoints name
    their architecture and version in the pickle, and exported metatomic models carry
    metatomic's classes in their code."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [name for name in names if name.endswith("data.pkl")]
            header = archive.read(pickles[0])[:100_000] if pickles else b""
    except (zipfile.BadZipFile, OSError, KeyError):
        return None
    if any("metatomic" in name or "metatensor" in name for name in names):
        return (
            "a metatomic model (exported by metatrain or another metatomic tool), not an "
            "atomtrain model; run it with metatomic (metatomic-ase's MetatomicCalculator, "
            "LAMMPS, i-PI), or train it anew with atomtrain on the same options file"
        )
    if b"model_ckpt_version" in header or b"metatrain" in header:
        return (
            "a metatrain checkpoint, which atomtrain cannot read; train anew with "
            "atomtrain on the same options file (metatrain's format runs unchanged)"
        )
    return None
