"""gunicorn configuration for attention-trace (committed; used by `make run` and the image).

gunicorn's own sync worker serves: one request at a time per process, one
process per core. It is meant to sit behind a buffering proxy, and every
documented network deployment puts nginx in front (deploy/nginx.conf, the
Kubernetes sidecar, the README's single-host set-up): nginx reads each
request whole and holds each answer for a slow reader, so a worker only ever
talks to nginx. The app bounds its own costs (body and JSON-value limits, the
work budget: service/edge.py, service/budget.py). docs/deploy.md has the
measurement that chose the worker class.

Two listening ports serve the same app: PORT for the work, LIGHT_PORT for
what must never wait behind it (nginx sends everything but the POST
endpoints there: health probes, /version, the viewer's files). A sync worker that finishes a
request takes a connection waiting on LIGHT_PORT before the next one on
PORT, so a probe waits for at most the request a worker is computing, never
for the queue of POSTs behind it.

Environment:
  HOST, PORT          bind address (default 127.0.0.1:8000; the image sets HOST=0.0.0.0)
  LIGHT_PORT          the second port, on HOST (default PORT + 1)
  WEB_CONCURRENCY     worker processes (default: the CPUs this process may use)
  GUNICORN_TIMEOUT    seconds one request may run before its worker is killed and
                      replaced (default 30): a runaway request
  GUNICORN_MAX_REQUESTS  requests after which a worker is replaced (default 20000,
                      plus up to 10 % jitter; 0 = never): a backstop against heap growth
  LOG_LEVEL           gunicorn error-log level (default info)
"""

import json
import os

from gunicorn.glogging import Logger

# One BLAS thread per worker (see service/wsgi.py); set before any numpy import.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_host, _port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
# LIGHT_PORT first: a worker accepts from its ready listeners in this order.
bind = [f"{_host}:{os.environ.get('LIGHT_PORT') or _port + 1}", f"{_host}:{_port}"]
# The work is CPU-bound numpy with one BLAS thread: one sync worker per core
# keeps every core busy without oversubscribing them (gthread measured no
# better behind nginx: docs/deploy.md, "The worker class").
workers = int(os.environ.get("WEB_CONCURRENCY", _cpus()))
worker_class = "sync"
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
# Workers are replaced after this many requests (spread by the jitter so that
# they do not all restart at once), a backstop against slow heap growth
# (docs/deploy.md, "Worker recycling"). The master keeps the listening socket:
# a request waiting while a worker is replaced is answered by the next one.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "20000"))
max_requests_jitter = max_requests // 10
# On SIGTERM, workers get this long to finish in-flight requests: a clean stop
# within a few seconds (container runtimes wait 10 s before SIGKILL).
graceful_timeout = 5
# Bound request lines and headers (gunicorn answers 400 above them).
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190

loglevel = os.environ.get("LOG_LEVEL", "info")
errorlog = "-"
accesslog = "-"
# One JSON object a line. The request id is the X-Request-ID response header,
# the caller's when it was well formed; bodies are never logged.
access_log_format = (
    '{"time":"%(t)s","request_id":"%({x-request-id}o)s","remote":"%(h)s","method":"%(m)s",'
    '"path":"%(U)s","status":%(s)s,"bytes":%(B)s,"duration_us":%(D)s,"pid":"%(p)s","user_agent":"%(a)s"}'
)


class JsonAtoms(dict):
    """gunicorn's access-log atoms, each string JSON-escaped (gunicorn's own escape only quotes): a
    backslash or a percent-decoded newline in a path can neither break a line nor forge a field.

    Escaped when the format reads an atom, not when the atoms are made: gunicorn makes one for every
    request header, response header and environ entry (~50 an S request), the format reads ten.
    Escaping them all up front cost ~22 us of an S request's ~900 us of worker CPU (measured).
    Missing atoms read as "-" and header atoms case-insensitively, as gunicorn's SafeAtoms does.
    """

    def __getitem__(self, k: str) -> object:
        v = dict.get(self, k.lower() if k.startswith("{") else k, "-")
        return json.dumps(v)[1:-1] if isinstance(v, str) else v


class JsonLogger(Logger):
    atoms_wrapper_class = JsonAtoms


logger_class = JsonLogger
proc_name = "attention-trace"
# No runtime control socket: it would be written under $HOME, which a
# read-only, non-root container may not have, and nothing here uses it.
control_socket_disable = True
