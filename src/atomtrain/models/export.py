"""Export a model to one TorchScript file and load it back without the training code.

The file needs ``sphericart.torch`` imported before loading: it provides the spherical
harmonics operator and registers its derivatives. :func:`load_exported` does that.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import torch

from ..errors import AtomtrainError
from ..io import atomic_write

# the model's hyperparameters, stored beside the TorchScript code (which does not keep
# them) so that an exported model can be fine-tuned
HYPERS_FILE = "atomtrain_hypers.json"


def export(model: torch.nn.Module, path: str | Path) -> None:
    """Write ``model`` (eval mode, on CPU) as TorchScript to ``path``, atomically, with
    its hyperparameters."""
    exported = copy.deepcopy(model).cpu().eval()
    with warnings.catch_warnings():
        # TorchScript is deprecated in recent torch, but it is what loads without
        # Python code; the warning is not actionable for users
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(exported)
    extra = {HYPERS_FILE: json.dumps(getattr(model, "hypers", {}))}
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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(str(path), map_location=device, _extra_files=extra or {})
    except Exception as error:
        raise AtomtrainError(
            f"{path}: not an exported atomtrain model ({str(error).splitlines()[0]}); "
            "export a checkpoint with 'atomtrain export model.ckpt -o model.pt'"
        ) from error
