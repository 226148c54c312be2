"""Python client and command-line tool for the attention-trace service.

``Client(url)`` talks to a running service over HTTP; ``LocalClient()`` has
the same methods and computes in this process (no server). ``attention-trace``
is the command-line tool (see ``attention_trace.cli``).
"""

from .client import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    BatchItem,
    CheckResult,
    Client,
    ClientError,
    Config,
    Diagnosis,
    Health,
    InjectedBug,
    LocalClient,
    Mismatch,
    Parameters,
    ProblemError,
    Stage,
    StageCheck,
    Stats,
    Token,
    Tolerance,
    Trace,
    TransportError,
    VersionInfo,
)

__all__ = [
    "DEFAULT_RETRIES", "DEFAULT_TIMEOUT", "BatchItem", "CheckResult", "Client", "ClientError", "Config",
    "Diagnosis", "Health", "InjectedBug", "LocalClient", "Mismatch", "Parameters", "ProblemError", "Stage",
    "StageCheck", "Stats", "Token", "Tolerance", "Trace", "TransportError", "VersionInfo",
]
