"""attention-trace performance suite: ``python -m bench.run [--quick]``, or ``make bench``.

Not part of the test suite and not imported by the service; see bench/README.md
and docs/performance.md.
"""
