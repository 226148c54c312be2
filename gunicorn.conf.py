"""gunicorn configuration for attention-trace (committed; used by `make run` and the image).

Environment:
  HOST, PORT          bind address (default 127.0.0.1:8000; the image sets HOST=0.0.0.0)
  WEB_CONCURRENCY     worker processes (default: the CPUs this process may use)
  GUNICORN_TIMEOUT    seconds a worker may spend on one request before it is
                      killed and replaced (default 30): frees a worker held by a
                      slow client or a runaway request
  LOG_LEVEL           gunicorn error-log level (default info)
"""

import os

# One BLAS thread per worker (see service/wsgi.py); set before any numpy import.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


bind = [f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"]
# The work is CPU-bound numpy with one BLAS thread: one sync worker per core
# keeps every core busy without oversubscribing them.
workers = int(os.environ.get("WEB_CONCURRENCY", _cpus()))
worker_class = "sync"
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
# On SIGTERM, workers get this long to finish in-flight requests: a clean stop
# within a few seconds (container runtimes wait 10 s before SIGKILL).
graceful_timeout = 5
keepalive = 5
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
proc_name = "attention-trace"
# No runtime control socket: it would be written under $HOME, which a
# read-only, non-root container may not have, and nothing here uses it.
control_socket_disable = True

# No server banner: answer "Server: attention-trace" rather than naming the
# WSGI server. Workers fork from the master, so they inherit this.
import gunicorn.http.wsgi  # noqa: E402

gunicorn.http.wsgi.SERVER = "attention-trace"

# Access log values JSON-escaped; gunicorn's own error answers as problem+json;
# a slow client timed out gets 408 (see service/gunicorn_support.py).
from service.gunicorn_support import JsonAccessLogger, install  # noqa: E402

logger_class = JsonAccessLogger
install()
