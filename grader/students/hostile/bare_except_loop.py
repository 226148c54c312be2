"""Hostile: loops forever when imported, swallowing every exception with a bare except (the trick
that left no results.json when the grader's time limit was an exception raised in-process)."""

import signal
import time

for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):
    signal.signal(sig, signal.SIG_IGN)

while True:
    try:
        time.sleep(0.01)
    except:  # noqa: E722
        pass
