"""gunicorn configuration for attention-trace (committed; used by `make run` and the image).

Environment:
  HOST, PORT          bind address (default 127.0.0.1:8000; the image sets HOST=0.0.0.0)
  WEB_CONCURRENCY     worker processes (default: the CPUs this process may use)
  GUNICORN_TIMEOUT    seconds one request may run in the application before the
                      worker is killed and replaced (default 30): a runaway request
  GUNICORN_HEADER_TIMEOUT  seconds a client has to send a request head (default 10)
  GUNICORN_BODY_TIMEOUT    longest pause in a request body, and its grace period
                      before the minimum rate of 16 KiB/s applies (default 10)
  GUNICORN_SEND_TIMEOUT    longest a client may read nothing of its answer (default 10)
  GUNICORN_WORKER_CONNECTIONS  open connections per worker (default 256); when
                      full, the slowest client still sending its request is dropped
  GUNICORN_MAX_QUEUE  complete requests waiting for a worker's compute thread
                      before it answers 503 (default 16)
  GUNICORN_MAX_BUFFERED  bytes of request bodies and answers a worker holds
                      (default 64 MiB): a body over 64 KiB waits, unread, for room
                      (503 after 15 s); over it, the most stalled reader is cut off
  GUNICORN_INLINE_MS  a request the app expects to cost at most this many ms of
                      CPU is answered on the worker's event-loop thread when its
                      compute thread is idle (default 5; 0 = never)
  GUNICORN_MAX_REQUESTS  requests after which a worker is replaced (default 20000,
                      plus up to 10 % jitter; 0 = never): a backstop against heap growth
  LOG_LEVEL           gunicorn error-log level (default info)
  GLIBC_TUNABLES      read by glibc when the process starts, so set it in the
                      server's environment (the Dockerfile and `make run` do):
                      glibc.malloc.hugetlb=1 puts large answers on transparent
                      huge pages (service/worker.py, MALLOC_TUNABLES); the master
                      logs a warning at start without it

The worker class is service.worker.BufferedWorker: it reads each request whole,
under deadlines, before the application sees it, and writes each answer as
the client reads it, so slow or idle clients cost a socket, not a worker
(docs/reliability.md, "Slow clients"). gunicorn's own parser and body readers
do all the HTTP framing, fed as bytes arrive (service/framing.py). It serves
plain HTTP/1.x: TLS ends at the proxy.
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
# The work is CPU-bound numpy with one BLAS thread: one worker process per core
# keeps every core busy without oversubscribing them. Each worker computes one
# request at a time; its event loop holds the connections (at most
# worker_connections, the slowest senders dropped first when full).
workers = int(os.environ.get("WEB_CONCURRENCY", _cpus()))
worker_class = "service.worker.BufferedWorker"
worker_connections = int(os.environ.get("GUNICORN_WORKER_CONNECTIONS", "256"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
# Workers are replaced after this many requests (spread by the jitter so that
# they do not all restart at once), a backstop against slow heap growth. A
# worker's RSS levels off within ~9,000 requests of a mixed load and stays
# there to 40,000 (docs/deploy.md, "Worker recycling"), and each replacement's
# boot costs ~0.3 s of CPU: 150 µs a request at 2,000, 15 µs at 20,000.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "20000"))
max_requests_jitter = max_requests // 10
# On SIGTERM, workers get this long to finish in-flight requests: a clean stop
# within a few seconds (container runtimes wait 10 s before SIGKILL).
graceful_timeout = 5
# Kept-alive connections wait this long for their next request.
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
import gunicorn.http.wsgi  # noqa: E402 (after the BLAS variables above)

gunicorn.http.wsgi.SERVER = "attention-trace"

# Access log values JSON-escaped; gunicorn's own error answers as problem+json;
# a slow client timed out gets 408 (see service/gunicorn_support.py).
from service.gunicorn_support import JsonAccessLogger, install  # noqa: E402 (after the BLAS variables above)
from service.settings import Settings  # noqa: E402 (after the BLAS variables above)
from service.worker import configure, malloc_note  # noqa: E402 (after the BLAS variables above)

logger_class = JsonAccessLogger
install()


def on_starting(server) -> None:
    note = malloc_note()
    if note:
        server.log.warning(note)

configure(
    header_timeout=float(os.environ.get("GUNICORN_HEADER_TIMEOUT", "10")),
    body_timeout=float(os.environ.get("GUNICORN_BODY_TIMEOUT", "10")),
    send_timeout=float(os.environ.get("GUNICORN_SEND_TIMEOUT", "10")),
    max_queue=int(os.environ.get("GUNICORN_MAX_QUEUE", "16")),
    keepalive_requests=int(os.environ.get("GUNICORN_KEEPALIVE_REQUESTS", "100")),
    max_buffered=int(os.environ.get("GUNICORN_MAX_BUFFERED", str(64 * 1024 * 1024))),
    inline_max=float(os.environ.get("GUNICORN_INLINE_MS", "5")) / 1000,
    # the worker refuses a larger Content-Length unread (the app answers 413)
    max_body_bytes=Settings.from_env().max_body_bytes,
    max_check_body_bytes=Settings.from_env().max_check_body_bytes,  # /check and /check/batch
)
