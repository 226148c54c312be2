"""The shared grading core of the attention-trace autograder examples (Gradescope, PrairieLearn).

    from grading import config, core
    course = config.load("course.toml")
    result = core.grade("path/to/submission", course)   # a GradeResult

* ``config``: the course file (TOML): configurations, tests, points, visibility, metric, limits;
* ``assignment``: the functions students write and what each is graded as;
* ``core``: grading one submission (reference, sandbox, /check, points, messages);
* ``sandbox``, ``launcher``, ``harness``: the student's code in a separate, limited process;
* ``runtime``: the student's interpreter (stdlib + numpy), readable by an unprivileged uid.

The platform adapters (``examples/gradescope/grade.py``, ``examples/prairielearn/grade.py``) only
turn a GradeResult into their platform's results.json. ``python -m grading --help`` has the
set-up and self-test commands.
"""

__all__ = ["assignment", "config", "core", "runtime", "sandbox"]
