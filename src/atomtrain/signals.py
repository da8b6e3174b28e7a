"""The signals that ask a run to stop, shared by the training loop (which checkpoints
and stops) and the --nproc launcher (which forwards them to its workers)."""

from __future__ import annotations

import signal

# exit code of a command stopped by a stop signal: a run after writing its checkpoint
# (resume it), a conversion after removing what it had written (run it again)
EXIT_STOPPED = 75

# the scheduler's (SIGTERM, SIGUSR1), Ctrl-C, and a closed terminal
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
# A stop signal repeated within this many seconds is the same request delivered twice:
# scancel signals every process of a step and the --nproc launcher forwards what it got,
# a terminal's Ctrl-C reaches the launcher and its workers alike.
REPEAT_WINDOW = 1.0


def take_stop_signals(handler) -> dict[int, object]:
    """``handler`` for the stop signals, except those ignored by whoever started the
    process (nohup ignores SIGHUP, a shell SIGINT for commands it starts in the
    background); returns the handlers it replaced, for ``give_back_signals``."""
    previous: dict[int, object] = {}
    for number in STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            previous[number] = signal.signal(number, handler)
    return previous


def give_back_signals(previous: dict[int, object]) -> None:
    for number, handler in previous.items():
        signal.signal(number, handler)  # type: ignore[arg-type]
