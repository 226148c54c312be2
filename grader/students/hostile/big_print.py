"""Hostile: prints 1 GB when imported (it must fill neither the grader's memory nor its disk)."""

import sys

try:
    print("x" * 10**9)  # one 1 GB string (the memory limit may refuse it)
except MemoryError:
    pass
chunk = "y" * (1 << 20)
for _ in range(1024):  # 1 GiB, 1 MiB at a time
    sys.stdout.write(chunk)
sys.stdout.flush()
