"""Everything that talks to torch.distributed lives here; the rest of atomtrain calls
these helpers, which are no-ops in a single process (one code path)."""

from .context import Context, single_process
from .env import LaunchInfo, detect_launch

__all__ = ["Context", "LaunchInfo", "detect_launch", "single_process"]
