"""The attention-trace autograder: grades "write multi-head self-attention in numpy" submissions
in a sandbox, against the engine's reference, for any platform (Gradescope, PrairieLearn adapters in
``examples/``).

    from grader import config, core
    course = config.load("course.toml")
    result = core.grade("path/to/submission", course)   # a GradeResult

* ``config``: the course file (TOML): configurations, tests, points, visibility, metric, limits;
* ``assignment``: the functions students write and what each is graded as;
* ``core``: grading one submission (reference, sandbox, check, points, messages);
* ``reference``: the reference and the verdicts, from the engine in this process (or a service's URL);
* ``block``: a block course's references, verdicts and diagnosis (``[block]``: the Transformer block);
* ``sandbox``, ``launcher``, ``harness``: the student's code in a separate, limited process;
* ``runtime``: the student's interpreter (stdlib + numpy), readable by an unprivileged uid.

The platform adapters (``examples/gradescope/grade.py``, ``examples/prairielearn/grade.py``) only
turn a GradeResult into their platform's results.json. ``attention-trace-grade --help`` (or
``python -m grader --help``) has the set-up and self-test commands. Nothing here imports a web
framework: the engine (numpy) is the reference.
"""

from pathlib import Path

#: the shipped course file (the default of ``selftest``) and the students the self-test grades
COURSE = Path(__file__).resolve().parent / "course.toml"
STUDENTS = Path(__file__).resolve().parent / "students"

__all__ = ["COURSE", "STUDENTS", "assignment", "config", "core", "reference", "runtime", "sandbox"]
