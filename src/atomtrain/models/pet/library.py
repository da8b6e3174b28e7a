"""metatrain's PET network (``metatrain.pet.modules``), imported without the package
``metatrain.pet`` itself: its ``__init__`` imports metatrain's PET model, trainer and
data code (3 s here, and most of metatrain), none of which atomtrain runs.

The network's modules import nothing of that package but the type of its
hyperparameters (``metatrain.pet.documentation.ModelHypers``, a TypedDict, which in turn
imports metatrain's loss and data code). While they are imported, ``metatrain.pet`` is a
bare package and that module a stand-in holding the type's name; both are removed
afterwards, so that a later ``import metatrain.pet`` in the same process (a test
comparing with metatrain's own PET) imports the real package, around the same modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

from ...errors import AtomtrainError
from ...runtime import unimported

PINNED = "metatrain==2026.4.1"
NETWORK = "metatrain.pet.modules.backend"
# the neighbor layout (NEF) and cutoff functions the network's inputs are made with
HELPERS = ("metatrain.pet.modules.nef", "metatrain.pet.modules.utilities")


def import_pet() -> tuple[types.ModuleType, ...]:
    """metatrain's modules ``backend`` (PETBackend), ``nef`` and ``utilities``, or one
    line saying what to install."""
    if NETWORK not in sys.modules:
        with unimported("IPython"):  # metatrain imports metatensor-torch
            import_network()
    return tuple(importlib.import_module(name) for name in (NETWORK, *HELPERS))


def import_network() -> None:
    try:
        found = importlib.util.find_spec("metatrain")
    except (ImportError, ValueError):  # ValueError: a module without a spec
        found = None
    if found is None or found.origin is None:
        raise AtomtrainError(
            "architecture pet needs metatrain's PET network (metatrain is not installed): "
            f"run 'pip install atomtrain[pet]' or 'pip install {PINNED}'"
        )
    if "metatrain.pet" in sys.modules:  # the real package is already there
        importlib.import_module(NETWORK)
        return
    import metatrain

    package = types.ModuleType("metatrain.pet")
    package.__path__ = [str(Path(found.origin).parent / "pet")]
    hypers = types.ModuleType("metatrain.pet.documentation")
    hypers.ModelHypers = dict  # type: ignore[attr-defined]
    sys.modules["metatrain.pet"] = package
    sys.modules["metatrain.pet.documentation"] = hypers
    try:
        importlib.import_module(NETWORK)
    except ImportError as error:
        raise AtomtrainError(
            f"metatrain's PET network could not be imported ({error}); atomtrain reads "
            f"the network of {PINNED}: run 'pip install {PINNED}'"
        ) from error
    finally:
        del sys.modules["metatrain.pet"], sys.modules["metatrain.pet.documentation"]
        if getattr(metatrain, "pet", None) is package:
            del metatrain.pet
