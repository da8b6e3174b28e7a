"""``atomtrain``: train, evaluate and export interatomic potentials."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys

from .. import __version__
from ..distributed.env import detect_launch
from ..distributed.faults import PeerFailure
from ..errors import AtomtrainError
from ..models import registry
from ..runtime import keep_freed_memory, this_process_runs_one_command
from ..training.outputs import LOGGER_NAME, close_logging
from ..training.phases import mark_command_start
from . import convert as convert_command
from . import eval as eval_command
from . import export as export_command
from . import train as train_command

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(
        prog="atomtrain",
        description="Train machine-learning interatomic potentials (architectures: "
        f"{', '.join(registry.known())}) on one CPU, one GPU, several GPUs or many nodes.",
    )
    main_parser.add_argument("--version", action="version", version=f"atomtrain {__version__}")
    commands = main_parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (train_command, eval_command, export_command, convert_command):
        module.add_parser(commands)
    return main_parser


def _rank() -> int:
    """This process's rank, for deciding who prints an error all ranks share."""
    try:
        return detect_launch(os.environ).rank
    except AtomtrainError:
        return 0


def main(argv: list[str] | None = None) -> int:
    mark_command_start()
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
        return int(arguments.run(arguments) or 0)
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
