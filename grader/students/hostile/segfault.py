"""Hostile (or just unlucky): project crashes the interpreter with a segmentation fault."""

import ctypes

import numpy as np


def project(x, W):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def scores(q, k):
    return q @ k.transpose(0, 2, 1)  # right: its points are earned
