"""Importing sphericart.torch in a process where an MD engine already loaded the copy
of its library that export collected into ``extensions/``.

sphericart.torch loads its compiled library from site-packages when imported; a second
copy of the library registering the same operator namespace aborts the process (torch:
"Only a single TORCH_LIBRARY can be used to register the namespace sphericart_torch").
That happens when a script first runs the exported model through metatomic (which
loads ``extensions/.../libsphericart_torch.so``) and then imports atomtrain. The
operators are then already there: the import skips loading the library again, and
registers sphericart's Python parts (classes, autograd formulas) on them.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from types import ModuleType

import torch

from ...errors import AtomtrainError

NAMESPACE = "sphericart_torch"
# sphericart compiles its CUDA kernels at run time with NVIDIA's runtime compiler of
# CUDA 12, which a torch built for CUDA 13 does not bring along
CUDA12_COMPILER = "libnvrtc.so.12"


def operators_registered() -> bool:
    try:
        getattr(torch.ops, NAMESPACE).spherical_harmonics  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def import_sphericart_torch() -> ModuleType:
    """``sphericart.torch``, imported without loading its library a second time."""
    if "sphericart.torch" in sys.modules or not operators_registered():
        import sphericart.torch

        return sphericart.torch
    load_library = torch.classes.load_library
    torch.classes.load_library = lambda path: None  # the engine's copy is loaded
    try:
        import sphericart.torch
    finally:
        torch.classes.load_library = load_library
    return sphericart.torch


def load_cuda12_compiler() -> bool:
    """Load libnvrtc.so.12 from an installed ``nvidia-cuda-nvrtc-cu12``, if there is one,
    so that sphericart's CUDA library finds it (the dynamic loader reuses a library
    already loaded under the same name) without LD_LIBRARY_PATH."""
    for entry in sys.path:
        candidate = Path(entry or ".") / "nvidia" / "cuda_nvrtc" / "lib" / CUDA12_COMPILER
        if candidate.is_file():
            ctypes.CDLL(str(candidate), mode=ctypes.RTLD_GLOBAL)
            return True
    return False


def check_harmonics_on(device: torch.device | str) -> None:
    """Run sphericart once on ``device``: on a GPU whose CUDA libraries it cannot load,
    one line that says what to install, instead of a loader error in the first step."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    sphericart = import_sphericart_torch()
    if not (torch.version.cuda or "").startswith("12."):
        load_cuda12_compiler()
    try:
        sphericart.SphericalHarmonics(1)(torch.ones(1, 3, device=device))
    except RuntimeError as error:
        if "nvrtc" not in str(error).lower():
            raise
        raise AtomtrainError(
            f"sphericart cannot run on {device}: it needs NVIDIA's CUDA 12 runtime "
            f"compiler ({CUDA12_COMPILER}), which torch {torch.__version__} (CUDA "
            f"{torch.version.cuda}) does not bring; run 'pip install "
            "nvidia-cuda-nvrtc-cu12' (atomtrain then finds it), or use device: cpu"
        ) from error
