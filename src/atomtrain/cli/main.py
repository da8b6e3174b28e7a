"""``atomtrain``: train, evaluate and export interatomic potentials."""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys

from ..errors import AtomtrainError, PeerFailure
from ..runtime import keep_freed_memory, this_process_runs_one_command
from ..training.outputs import LOGGER_NAME, close_logging
from ..training.phases import mark_command_start
from .arguments import parser

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


def _rank() -> int:
    """This process's rank, for deciding who prints an error all ranks share."""
    from ..distributed.env import detect_launch

    try:
        return detect_launch(os.environ).rank
    except AtomtrainError:
        return 0


def main(argv: list[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    if arguments.command is None:
        parser().print_help()
        return EXIT_USER_ERROR
    arguments.argv = list(sys.argv[1:] if argv is None else argv)
    keep_freed_memory()
    # a log file that cannot be written (a full disk) must not print tracebacks: the
    # error that matters is reported by the write that failed
    logging.raiseExceptions = False
    logger = logging.getLogger(LOGGER_NAME)
    try:
        command = importlib.import_module(f"{__package__}.{arguments.command}")
        mark_command_start()  # what came before, the command's imports too, is the start
        return int(command.run(arguments) or 0)
    except AtomtrainError as error:
        logger.debug("error details", exc_info=True)
        # an error every rank reached together is printed once, by rank 0
        if not getattr(error, "collective", False) or _rank() == 0:
            print(f"atomtrain: {error}", file=sys.stderr)
        code = error.exit_code
        if isinstance(error, PeerFailure) and argv is None:
            # a lost peer can leave threads blocked on dead sockets: do not wait for them
            sys.stdout.flush()
            sys.stderr.flush()
            import logging as _logging

            _logging.shutdown()
            os._exit(code)
        return code
    except KeyboardInterrupt:
        print("atomtrain: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        logger.debug("unexpected error", exc_info=True)
        has_file = any(isinstance(h, logging.FileHandler) for h in logger.handlers)
        where = (
            "the traceback is in the run's train.log"
            if has_file
            else ("rerun with ATOMTRAIN_DEBUG=1 for the traceback")
        )
        print(
            f"atomtrain: unexpected error: {type(error).__name__}: {error} ({where})",
            file=sys.stderr,
        )
        if os.environ.get("ATOMTRAIN_DEBUG"):
            raise
        return EXIT_INTERNAL_ERROR
    finally:
        if argv is not None:  # called in-process (a notebook, the tests): its logging back
            close_logging()


def entry() -> None:
    """The command line's entry: ``main``, then, when the command succeeded, a quick
    exit. Python's teardown of the modules a command imported (torch, torch._dynamo,
    sympy, matplotlib) takes 0.9 s here, a sixth of a short training run: the exit
    handlers run (logging's flush among them) and the process ends without it. A failed
    command ends as usual: a rank that failed hosts the rendezvous store while it tears
    down, which is when its peers, blocked in a collective, learn why it stopped."""
    this_process_runs_one_command()
    code = main()
    if code != 0:
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, or a closed stream
            pass
    os._exit(code)
