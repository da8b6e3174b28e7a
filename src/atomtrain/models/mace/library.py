"""mace-torch and e3nn, imported once with the one setting they need.

e3nn 0.4.4 loads its constants with a bare ``torch.load``, which torch >= 2.6 refuses
unless TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set. The variable is set for the import only
and restored at once: atomtrain's own loads pass ``weights_only=True`` explicitly and
are never weakened, and no later ``torch.load`` of the process sees it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from collections.abc import Iterator

from ...errors import AtomtrainError

VARIABLE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
PINNED = "mace-torch==0.3.16"


@contextlib.contextmanager
def e3nn_constants_loadable() -> Iterator[None]:
    previous = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[VARIABLE]
        else:
            os.environ[VARIABLE] = previous


def import_mace():
    """(mace.modules, e3nn.o3, e3nn.util.jit), or one line that says what to install."""
    with e3nn_constants_loadable(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e3nn's and torch's, about the load above
        # mace announces on import that cuequivariance is absent, which is the default
        quiet = logging.getLogger()
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                import e3nn.o3
                import e3nn.util.jit
                import mace.modules
        except ImportError as error:
            raise AtomtrainError(
                f"architecture mace needs mace-torch ({error.name} is missing): run "
                f"'pip install {PINNED}' or 'pip install atomtrain[mace]'"
            ) from error
        finally:
            quiet.setLevel(level)
    return mace.modules, e3nn.o3, e3nn.util.jit
