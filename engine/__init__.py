"""attention-trace engine: every stage of multi-head self-attention, in pure numpy.

No web framework, validation library or HTTP here. Where things live:

* ``attention``: the correct steps, one small pure function each;
* ``block``: the Transformer block's steps around the attention (norms, feed-forward network, residual sums);
* ``layer``: the configuration (``TraceConfig``) and the steps it chooses (one layer, or a stack of blocks);
* ``bugs``: the known mistakes, each a swapped step;
* ``checks``: every rule a request must meet, defined once;
* ``tracing``: ``trace`` runs the steps and keeps every stage; ``recompute`` and ``diagnose`` swap in a bug;
* ``checking``: a student's numbers against a trace (comparison, diagnosis, hints), for /check and the grader;
* ``decoding``: ``decode`` re-runs a causal trace token by token with a KV cache;
* ``params``, ``tokenize``: seeded weights and embeddings, the tokenizer;
* ``export``: the viewers' input formats; ``recipe``: prints a configuration's steps (``python -m engine.recipe``).
"""

from .bugs import BUG_NAMES, BUGS, Bug, applicable_bugs, check_bug
from .decoding import DecodeStep, decode, decode_value_count
from .errors import (
    BugNotApplicableError,
    DecodeUnavailableError,
    EmptyInputError,
    EngineError,
    HeadDivisionError,
    InvalidSizeError,
    KVHeadDivisionError,
    NonFiniteInputError,
    NumericOverflowError,
    RotaryDimensionError,
    ShapeError,
    StageUnavailableError,
    TooManyTokensError,
    TraceTooLargeError,
    UnknownBugError,
    VariantConflictError,
)
from .layer import (
    ALL_STAGE_IDS,
    POSITIONAL_ENCODING_CHOICES,
    STAGE_IDS,
    STAGE_INFO,
    STAGES,
    VARIANT_STAGE_IDS,
    TraceConfig,
    stage_axes,
    stage_ids,
    stage_shape,
    trace_value_count,
)
from .params import Parameters, explicit_parameters, generate_parameters, parameters_digest
from .tokenize import Token, tokenize
from .tracing import Stage, Trace, diagnose, inject_bug, recompute, recompute_values, same_numbers, trace
from .version import ENGINE_VERSION

__all__ = [
    "ALL_STAGE_IDS",
    "BUGS",
    "BUG_NAMES",
    "Bug",
    "BugNotApplicableError",
    "DecodeStep",
    "DecodeUnavailableError",
    "ENGINE_VERSION",
    "KVHeadDivisionError",
    "POSITIONAL_ENCODING_CHOICES",
    "RotaryDimensionError",
    "VARIANT_STAGE_IDS",
    "VariantConflictError",
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
    "decode",
    "diagnose",
    "decode_value_count",
    "explicit_parameters",
    "generate_parameters",
    "inject_bug",
    "parameters_digest",
    "recompute",
    "recompute_values",
    "same_numbers",
    "stage_axes",
    "stage_ids",
    "stage_shape",
    "tokenize",
    "trace",
    "trace_value_count",
]
