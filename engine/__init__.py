"""attention-trace engine: every stage of multi-head self-attention, in pure numpy.

No web framework, validation library or HTTP here. Where things live:

* ``attention``: the correct steps, one small pure function each;
* ``layer``: the configuration (``TraceConfig``) and the steps it chooses;
* ``bugs``: the known mistakes, each a swapped step;
* ``checks``: every rule a request must meet, defined once;
* ``tracing``: ``trace`` runs the steps and keeps every stage;
* ``params``, ``tokenize``: seeded weights and embeddings, the tokenizer.
"""

from .bugs import BUG_NAMES, BUGS, Bug, applicable_bugs, check_bug
from .errors import (
    BugNotApplicableError,
    EmptyInputError,
    EngineError,
    HeadDivisionError,
    InvalidSizeError,
    NonFiniteInputError,
    NumericOverflowError,
    ShapeError,
    StageUnavailableError,
    TooManyTokensError,
    TraceTooLargeError,
    UnknownBugError,
)
from .layer import STAGE_IDS, STAGE_INFO, STAGES, TraceConfig, stage_ids
from .params import Parameters, explicit_parameters, generate_parameters, parameters_digest
from .tokenize import Token, tokenize
from .tracing import Stage, Trace, inject_bug, recompute, same_numbers, trace
from .version import ENGINE_VERSION

__all__ = [
    "BUGS",
    "BUG_NAMES",
    "Bug",
    "BugNotApplicableError",
    "ENGINE_VERSION",
    "STAGES",
    "STAGE_IDS",
    "STAGE_INFO",
    "EmptyInputError",
    "EngineError",
    "HeadDivisionError",
    "InvalidSizeError",
    "NonFiniteInputError",
    "NumericOverflowError",
    "Parameters",
    "ShapeError",
    "Stage",
    "StageUnavailableError",
    "TooManyTokensError",
    "Token",
    "Trace",
    "TraceConfig",
    "TraceTooLargeError",
    "UnknownBugError",
    "applicable_bugs",
    "check_bug",
    "explicit_parameters",
    "generate_parameters",
    "inject_bug",
    "parameters_digest",
    "recompute",
    "same_numbers",
    "stage_ids",
    "tokenize",
    "trace",
]
