"""Hostile: every function ends the process with os._exit(0) (the trick that left no results.json and
a clean exit status when the grader ran the student's code in its own process)."""

import os


def _leave(*args, **kwargs):
    os._exit(0)


add_positional_encoding = project = scores = scale = mask = softmax = attend = concat = output = _leave
multi_head_attention = _leave
