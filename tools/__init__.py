"""The project's command-line tools and the helpers they share with the tests and the benchmark.

Each ``tools/<name>.py`` runs as ``python -m tools.<name>`` from the repository root; ``scripts/<name>`` is
a thin wrapper around its ``main()`` for the documented commands, the Makefile and CI. ``tools.server``
is the one way anything here, in tests/ or in bench/ starts gunicorn. Not part of the wheel: pyproject.toml
lists the runtime packages only.
"""
