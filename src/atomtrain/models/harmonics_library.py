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

import sys
from types import ModuleType

import torch

NAMESPACE = "sphericart_torch"


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
