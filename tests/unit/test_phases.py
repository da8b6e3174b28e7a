"""The log's time-by-phase line: phases add up in the order they began, and the time
before the command (the interpreter and imports) comes from the process's start."""

from __future__ import annotations

import subprocess
import sys
import time

from atomtrain.training import phases


def test_phases_add_up_in_order_with_their_notes():
    clock = phases.Phases()
    with clock.timed("setup"):
        time.sleep(0.02)
    clock.add("epochs", 1.5)
    clock.add("setup", 0.5, "data and model")
    summary = clock.summary()
    assert summary.startswith("time by phase: setup 0.5")
    assert "(data and model), epochs 1.50 s" in summary
    assert clock.seconds["setup"] >= 0.52


def test_the_time_before_the_command_is_the_process_age():
    """A process that sleeps 0.3 s before its command begins: that time is counted
    before the command's own."""
    code = (
        "import time; time.sleep(0.3)\n"
        "from atomtrain.training import phases\n"
        "phases.mark_command_start()\n"
        "print(phases.start_phases().seconds['start and imports'])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert 0.3 <= float(result.stdout) < 10.0
