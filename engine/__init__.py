"""attention-trace engine: every stage of multi-head self-attention, in pure numpy.

No web framework, validation library or HTTP here: arrays and weights are
passed explicitly to small pure functions, one per stage (see ``attention``),
and ``trace`` runs them all in walkthrough order.
"""

from .errors import (
    EmptyInputError,
    EngineError,
    HeadDivisionError,
    InvalidSizeError,
    ShapeError,
    TooManyTokensError,
    UnknownBugError,
)
from .bugs import BUG_NAMES, BUGS, Bug
from .params import Parameters, explicit_parameters, generate_parameters, parameters_digest
from .tokenize import Token, tokenize
from .trace import STAGE_IDS, STAGE_INFO, STAGES, Stage, Trace, TraceConfig, trace
from .version import ENGINE_VERSION

__all__ = [
    "BUGS",
    "BUG_NAMES",
    "Bug",
    "UnknownBugError",
    "ENGINE_VERSION",
    "STAGES",
    "STAGE_IDS",
    "STAGE_INFO",
    "EmptyInputError",
    "EngineError",
    "HeadDivisionError",
    "InvalidSizeError",
    "Parameters",
    "ShapeError",
    "Stage",
    "TooManyTokensError",
    "Token",
    "Trace",
    "TraceConfig",
    "explicit_parameters",
    "generate_parameters",
    "parameters_digest",
    "tokenize",
    "trace",
]
