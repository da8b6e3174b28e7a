"""Errors meant for the user: their message is one line that says what to do."""

# exit code of a command that lost another process it worked with: a rank of the run,
# or a conversion worker (killed from outside, out of memory)
EXIT_PROCESS_LOST = 3


class AtomtrainError(Exception):
    """An error caused by the user's input or environment, shown as one line. Each
    class declares the exit code the command line returns for it."""

    exit_code = 2  # bad input, or an output that cannot be written


class DataError(AtomtrainError):
    """A data file is missing, unreadable or holds invalid values."""


class OptionsError(AtomtrainError):
    """The options file or a command-line override is invalid."""


class DistributedError(AtomtrainError):
    """Setting up or running the process group failed (port, peers, launcher)."""


class PeerFailure(DistributedError):
    """Another rank died, failed or became unreachable; this rank stops too. (Here, not
    in distributed/faults.py, which imports torch: the command line tells it apart from
    a mistake in an options file without importing torch.)"""

    exit_code = EXIT_PROCESS_LOST


class PeerReportedError(PeerFailure):
    """Another rank failed with its own error (which it prints itself)."""
