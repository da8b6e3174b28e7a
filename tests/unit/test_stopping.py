"""Stop requests from signals: one request however many copies of a signal arrive at
once, and a second request later is obeyed at once."""

from __future__ import annotations

import os
import signal
from unittest import mock

import pytest

from atomtrain.training import stopping
from atomtrain.training.stopping import StopRequest


@pytest.fixture
def request_installed():
    stop = StopRequest()
    stop.install()
    yield stop
    stop.uninstall()


def test_a_signal_delivered_twice_at_once_is_one_request(request_installed):
    with mock.patch.object(stopping.time, "monotonic", side_effect=[100.0, 100.3]):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # e.g. from scancel and from the launcher
    assert request_installed.requested and request_installed.signal_name == "SIGTERM"


def test_a_second_ctrl_c_later_interrupts_at_once(request_installed):
    with mock.patch.object(stopping.time, "monotonic", side_effect=[100.0, 102.0]):
        os.kill(os.getpid(), signal.SIGINT)
        assert request_installed.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_handlers_are_given_back():
    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    stop.install()
    assert signal.getsignal(signal.SIGINT) != before
    stop.uninstall()
    assert signal.getsignal(signal.SIGINT) == before


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
