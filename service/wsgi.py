"""WSGI entry point: ``gunicorn -c gunicorn.conf.py service.wsgi:app``."""

import os

# One BLAS thread per worker: workers already use every core, and threaded
# BLAS inside them fights over the same cores (it tripled tail latency here).
# Set before numpy is imported; gunicorn.conf.py sets the same for the master.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from service import create_app  # noqa: E402 (after the BLAS variables, before numpy loads)

app = create_app()
