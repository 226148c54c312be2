"""Hostile: a fork bomb when imported; every child forks too, forever. The process limit bounds it,
the grader's clock ends it, and the sweep of the student's uid leaves nothing behind."""

import os

while True:
    try:
        if os.fork() == 0:
            os.setsid()  # leave the process group, too
    except:  # noqa: E722
        pass
