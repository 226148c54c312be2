# Production image for attention-trace: gunicorn serving service.wsgi:app.
#
#   docker build -t attention-trace .
#   docker run --rm -p 8000:8000 attention-trace
#
# The base image is a build argument so that a local stand-in can replace it:
# scripts/container-check builds this file unchanged on a Debian-built base.
# Any base with python3 (and its venv module) on PATH will do;
# both stages must use the same base, since the venv points at its python3.
ARG BASE_IMAGE=python:3.12-slim

# ---------------------------------------------------------------------------
# builder: a virtual environment holding the pinned dependencies and the
# package. A venv works whether python3 lives in /usr/local/bin (python:*
# images) or /usr/bin (distribution Pythons, which refuse a system-wide pip
# install under PEP 668).
FROM ${BASE_IMAGE} AS builder

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv

WORKDIR /src

# Dependencies first, so this layer is reused until requirements.txt changes.
COPY requirements.txt ./
RUN python -m pip install --no-cache-dir -r requirements.txt

# Then the code, installed without touching the dependencies. pip compiles
# the .pyc files here, so the read-only runtime never has to. Last, what the
# runtime never uses goes: pip itself and the packages' own test suites.
COPY pyproject.toml README.md gunicorn.conf.py openapi.yaml ./
COPY engine/ engine/
COPY service/ service/
COPY attention_trace/ attention_trace/
COPY grader/ grader/
COPY viewer/ viewer/
RUN python -m pip install --no-cache-dir --no-deps . \
    && python -m pip uninstall --yes pip setuptools wheel \
    && find /opt/venv -depth -type d -name tests -path '*/site-packages/*' -exec rm -rf {} +

# ---------------------------------------------------------------------------
# runtime: the base image, the venv and the gunicorn config; nothing else.
FROM ${BASE_IMAGE} AS runtime

ARG VERSION=0.1.0
ARG SOURCE_URL=https://example.invalid/attention-trace
ARG REVISION=unknown
LABEL org.opencontainers.image.title="attention-trace" \
      org.opencontainers.image.description="Stateless REST/JSON service that shows, number by number, what self-attention and multi-head attention compute." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="MIT"

# HOST, PORT and LIGHT_PORT are read by gunicorn.conf.py: bind 0.0.0.0:$PORT,
# and 0.0.0.0:$LIGHT_PORT for what must not wait behind the work (probes,
# GETs: the proxy sends them there). One BLAS thread per process: gunicorn's
# workers are the unit of parallelism.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    HOST=0.0.0.0 \
    PORT=8000 \
    LIGHT_PORT=8001 \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    MKL_NUM_THREADS=1

COPY --from=builder /opt/venv /opt/venv
# The working directory holds what gunicorn and the app read from it: the
# committed gunicorn config and openapi.yaml (served at /openapi.yaml).
WORKDIR /app
COPY --from=builder /src/gunicorn.conf.py /src/openapi.yaml ./

# A numeric uid/gid that owns nothing in the image: the code and the venv are
# root-owned and read-only to it. No passwd entry is needed (nothing looks the
# user up), which keeps this stage free of RUN steps: build-time mounts (such
# as a CA bundle for pip) can then only ever touch the builder stage.
USER 10001:10001
EXPOSE 8000 8001

# No curl in the image: python's urllib asks /health on LIGHT_PORT, where it
# never waits behind a queue of traces.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import json, os, sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LIGHT_PORT', '8001'), timeout=4); sys.exit(0 if json.load(r).get('status') == 'ok' else 1)"]

# gunicorn is PID 1 (exec form, no shell), so SIGTERM reaches its master,
# which stops the workers gracefully and exits.
STOPSIGNAL SIGTERM
CMD ["gunicorn", "--config", "gunicorn.conf.py", "service.wsgi:app"]
