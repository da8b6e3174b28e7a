"""Stop requests from signals: one request however many copies of a signal arrive at
once, and a repeat told by when it arrived (tests/integration/test_faults.py runs the
repeat that stops a process, with a rank waiting in a collective)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from atomtrain.signals import REPEAT_WINDOW, STOP_SIGNALS, SignalArrivals, give_back_signals
from atomtrain.training.stopping import StopRequest


@pytest.fixture
def request_installed():
    """A stop request installed as in a process started from a terminal: the suite
    itself may run under nohup, which ignores SIGHUP (and the request leaves ignored
    signals alone, tested below)."""
    started_with = {number: signal.signal(number, signal.SIG_DFL) for number in STOP_SIGNALS}
    stop = StopRequest()
    stop.install()
    yield stop
    stop.uninstall()
    for number, handler in started_with.items():
        signal.signal(number, handler)


def test_a_signal_delivered_twice_at_once_is_one_request(request_installed):
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)  # e.g. from scancel and from the launcher
    time.sleep(0.1)  # the arrivals thread has read both (a repeat would end pytest)
    assert request_installed.requested and request_installed.signal_name == "SIGTERM"


def test_a_signal_is_a_repeat_by_when_it_arrived():
    """SignalArrivals calls back for a stop signal arriving more than REPEAT_WINDOW after
    the first, not for the first nor for other signals."""
    repeats = []
    previous = {number: signal.signal(number, lambda *unused: None) for number in STOP_SIGNALS}
    previous[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, lambda *unused: None)
    arrivals = SignalArrivals(STOP_SIGNALS, repeats.append)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(REPEAT_WINDOW + 0.3)
        os.kill(os.getpid(), signal.SIGUSR2)  # not a stop signal
        time.sleep(0.2)
        assert repeats == []
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5.0
        while not repeats and time.monotonic() < deadline:
            time.sleep(0.01)
        assert repeats == [signal.SIGINT]
    finally:
        arrivals.stop()
        give_back_signals(previous)


def test_uninstall_gives_back_the_wakeup_descriptor_and_ends_the_thread():
    stop = StopRequest()
    stop.install()
    assert any(thread.name == "atomtrain-signals" for thread in threading.enumerate())
    stop.uninstall()
    assert signal.set_wakeup_fd(-1) == -1
    assert not any(thread.name == "atomtrain-signals" for thread in threading.enumerate())


def test_handlers_are_given_back():
    # Python's own handler, whatever the starter left (a background job ignores SIGINT,
    # and an ignored signal stays ignored: the next test)
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        stop = StopRequest()
        stop.install()
        assert signal.getsignal(signal.SIGINT) != before
        stop.uninstall()
        assert signal.getsignal(signal.SIGINT) == before
    finally:
        signal.signal(signal.SIGINT, started_with)


def test_a_hangup_is_a_stop_request(request_installed):
    os.kill(os.getpid(), signal.SIGHUP)
    assert request_installed.signal_name == "SIGHUP"


def test_signals_ignored_by_the_starter_stay_ignored():
    """nohup ignores SIGHUP, a shell ignores SIGINT for background commands."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    stop = StopRequest()
    try:
        stop.install()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)
        assert not stop.requested
    finally:
        stop.uninstall()
        signal.signal(signal.SIGHUP, before)
