"""What a request costs, counted from the validated request before any work starts.

The unit is one number of a trace (one float the engine computes and the
response carries). Measured on the project's machine (docs/reliability.md,
"Every request's cost bounded"), in CPU time of the worker:

- a trace costs ~42 ns a number (the largest the limits allow, 2.5 M numbers,
  ~105 ms; JSON encoding is half of it);
- generating one weight set costs about one unit a weight: 4·d_model² numbers
  from SHAKE-256 plus their digest, ~26 + 5 ms at d_model 512 (1 M weights),
  ~47 ms a /trace/batch item with its own seed at d_model 512;
- a /check item costs 3–7 times the trace of the same shape (parsing and
  comparing the submission, then re-running the bugs' steps): counted as 4×;
- every item has a fixed overhead (validation, a Python loop), ~10 000 units.

A weight set is counted once per distinct (seed, d_model, num_heads,
num_kv_heads) in a batch, and counted whether or not it is cached: the bound
must not depend on what happened to be computed before. A stack of
Transformer blocks generates every layer's weights (attention, norms and
feed-forward network): its set is counted at its own weights
(``TraceConfig.n_parameters``), once per distinct stack. A single stack's
numbers and weights together are bounded by the budget when it is validated
(``engine.checks.check_block_cost``, in service/models.py), before any work.

The budget (``Settings.max_request_cost``) is what the most expensive single
/trace may cost: ``max_trace_values`` numbers plus one weight set at
``max_d_model``, 3.55 M units at the defaults (~150 ms). Every single /trace
is within it by construction (its numbers are bounded by ``max_trace_values``
and its weights by ``max_d_model``); a batch must fit in it as a whole.
Compression is bounded separately, by what the request has already cost
(service/compression.py): it can at most double a request's CPU.

A stack's ``/check`` costs more than its numbers: when the submission is wrong, the diagnosis recomputes the
stack once per applicable known mistake, from that mistake's step on and, since a stage holds every layer,
through the last layer. ``diagnosis_cost`` counts it from the request, in /check's units (the largest
one-layer /check, ``check_limit`` = 11.06 M units at the defaults, takes ~0.2 s: ~18 ns a unit): per
applicable mistake, ⅙ unit a number the stack makes, 2 units an exact-GELU element (``math.erf``, one at a
time) and 350 units a step (Python's overhead, ~6 µs with the rerun's bookkeeping). The coefficients bound the
measured diagnosis of five stacks, from 96 layers of d_model 8 to a d_ff-4096 exact-GELU stack
(docs/performance.md, current figures). A stack whose /check would cost more than ``check_limit``
(``CHECK_FACTOR`` times ``max_trace_values`` plus one weight set at ``max_d_model``) is refused before any
work (``refuse_costly_check``, 422 ``check_too_costly``); a /check/batch counts it in its cost. One attention
layer is bounded by its trace size, as before.

``/trace/html`` embeds its trace (and, when the budget allows, the
scale-flipped comparison trace) in the viewer's page: ``page_cost`` counts
those traces plus one unit a number for the page itself (escaping and copying
the JSON into the page, measured ~10 ns a number, and the page's second copy of
the JSON in memory). A page over the budget is refused before any work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.bugs import applicable_bugs
from engine.decoding import generate_work
from engine.lm import vocabulary
from engine.layer import layer_steps

from .problems import ProblemError

#: units of one batch item's fixed overhead
ITEM_COST = 10_000
#: a /check item costs this many times its trace's numbers
CHECK_FACTOR = 4
#: a stack's diagnosis, per applicable known mistake: one unit per this many numbers the rerun makes, units per
#: exact-GELU element, units per step (module docstring)
RERUN_NUMBERS_PER_UNIT = 6
ERF_UNITS = 2
STEP_UNITS = 350


def _stack(spec: Any) -> Any:
    """The validated request's configuration when it is a stack of blocks, else None."""
    config = getattr(spec, "_config", None)
    return config if config is not None and config.has_block else None


def weight_key(spec: Any) -> tuple | None:
    """The generated weight set a request needs (None when it brings its own)."""
    if getattr(spec, "parameters", None) is not None:
        return None
    stack = _stack(spec)
    if stack is not None:  # every layer's attention, norms and feed-forward network: what the weights depend on
        return ("stack", stack.seed, stack.d_model, stack.num_heads, stack.kv_heads, stack.num_layers,
                stack.ff_width, stack.gated, stack.norm_kind, stack.seeded_norm, stack.final_norm)
    return (getattr(spec, "seed", 0), spec.d_model, spec.num_heads, getattr(spec, "num_kv_heads", None))


def weight_cost(d_model: int, weights: int | None = None) -> int:
    """Units to generate one weight set: 4·d_model² numbers (an upper bound under grouped K/V heads), or a
    stack's ``weights`` (every layer's)."""
    return 4 * d_model * d_model if weights is None else weights


def spec_weights(spec: Any) -> int | None:
    """The weights a stack of blocks generates (None for one attention layer: 4·d_model² bounds it)."""
    stack = _stack(spec)
    return None if stack is None else stack.n_parameters


def diagnosis_cost(spec: Any) -> int:
    """Units a stack's /check may spend recomputing it for each applicable known mistake (0 for one attention
    layer, whose diagnosis CHECK_FACTOR covers): the reruns' numbers, exact-GELU elements and steps."""
    stack = _stack(spec)
    if stack is None:
        return 0
    n = len(spec.split)
    explicit = getattr(spec, "input", None) is not None
    bugs = len(applicable_bugs(stack, n, explicit_input=explicit))
    erf = n * stack.ff_width * stack.num_layers if stack.ffn_kind == "gelu" else 0  # [L, n, d_ff] through math.erf
    steps = len(layer_steps(stack, explicit_input=explicit))
    values = int(getattr(spec, "value_count", 0) or 0)
    return bugs * (-(-values // RERUN_NUMBERS_PER_UNIT) + ERF_UNITS * erf + STEP_UNITS * steps)


def generation_cost(spec: Any) -> int:
    """Units a /trace's ``generate`` spends decoding the sentence and the new tokens (engine.decoding.generate_work);
    0 without it."""
    count = getattr(spec, "generate", None)
    stack = _stack(spec)
    if count is None or stack is None:
        return 0
    texts = [t.text for t in spec.split]
    return generate_work(stack, len(texts), len(vocabulary(texts, stack.candidates)), count)


def cost(path: str, specs: Iterable[Any]) -> int:
    """The cost of answering these validated requests of one endpoint ("/trace" or "/check") together."""
    total, weights = 0, set()
    for spec in specs:
        values = int(getattr(spec, "value_count", 0) or 0)
        total += ITEM_COST + values * (CHECK_FACTOR if path == "/check" else 1)
        if path == "/check":
            total += diagnosis_cost(spec)
        total += generation_cost(spec)
        key = weight_key(spec)
        if key is not None and key not in weights:
            weights.add(key)
            total += weight_cost(spec.d_model, spec_weights(spec))
    return total


def page_cost(specs: Iterable[Any]) -> int:
    """The cost of /trace/html's page for these validated /trace requests (the trace, then its comparison)."""
    specs = list(specs)
    return cost("/trace", specs) + sum(int(getattr(spec, "value_count", 0) or 0) for spec in specs)


def check_limit(limits: Any) -> int:
    """What the largest one-layer /check the limits allow costs: the bound a stack's /check is held to."""
    return ITEM_COST + CHECK_FACTOR * limits.max_trace_values + weight_cost(limits.max_d_model)


def refuse_costly_check(spec: Any, limits: Any) -> None:
    """A 422 (``check_too_costly``) for a stack whose /check would cost more than ``check_limit``, before any
    work; nothing for one attention layer (its trace size bounds it)."""
    stack = _stack(spec)
    if stack is None:
        return
    work, limit = cost("/check", [spec]), check_limit(limits)
    if work > limit:
        message = f"{work} units; the limit is {limit}"
        raise ProblemError(422, "Invalid request",
                           f"checking this stack of {stack.num_layers} block(s) would cost {work} units of work "
                           f"(its trace, the comparison, and recomputing the stack for each known mistake that "
                           f"can show in it), above the limit of {limit} (the largest one-layer /check's); use "
                           "fewer layers or tokens, a narrower feed-forward network, or the tanh GELU",
                           kind="validation-error",
                           errors=[{"pointer": "", "type": "check_too_costly", "message": message}])
