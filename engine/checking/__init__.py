"""Checking a student's numbers against the engine's trace: what /check answers and the grader judges by.

Framework-free, as the rest of the engine (numpy only):

* ``compare``: the tolerance (``Tolerance``), reading a submitted stage into
  arrays, and the vectorised comparison, value by value;
* ``report``: ``check(trace, submission, tolerance)``, each stage's verdict,
  the first wrong stage, the known bugs that reproduce the submission
  (``engine.diagnose``) and the messages;
* ``hints``: what a student's numbers show when no known bug reproduces them.
"""

from .compare import Received, Tolerance
from .hints import HINT_CODES
from .report import Submission, check

__all__ = ["HINT_CODES", "Received", "Submission", "Tolerance", "check"]
