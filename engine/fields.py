"""Every field of a trace request, declared once: its type, bounds, default, unit, refusal, help, variant and names.

A trace request (the part every endpoint that traces shares: /trace, /check, /explain, /export) is the text to
trace, your own x and weights if you bring them, and the settings of the layer, a stack of blocks or constructed
heads. Each of them is one :class:`Field` in :data:`FIELDS`, in the order a request lists them, and every shell
derives what it needs from it, with no code of its own per field:

* the request models and so openapi.yaml (``service/models.py``: the schema's type, bounds, default and
  description; the engine's rule, run before the schema's checks; the configured limit, if any);
* the answer's ``config`` echo and its schema (``service/serialize.py``, ``ConfigOut``): a field is echoed, as
  the value in use (``echo``), when its variant is used;
* the command line's options (``attention_trace/cli.py``): ``cli`` names the option, ``help`` says what it does;
* the client's ``Config`` (``attention_trace/client.py``);
* the viewer's address and form (``service/static/url-state.js``, through ``GET /static/fields.js``, which
  :func:`viewer_declaration` writes): ``url`` names the address key, ``help`` is the control's hint.

Pure Python: the core carries no web framework or validation library (the shells translate).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import constructed
from . import interventions as IV
from . import lm as LM
from .checks import (
    D_FF_MAX,
    MAX_LAYERS,
    ROPE_BASE_MAX,
    SEED_MAX,
    check_choice,
    check_d_ff,
    check_kv_heads_value,
    check_norm_eps,
    check_num_layers,
    check_optional_choice,
    check_rope_base,
    check_variants,
    check_window_size,
    head_dim,
    kv_heads,
)
from .errors import raise_all
from .layer import (
    BLOCK_FIELDS,
    BLOCK_PRESETS,
    DEFAULT_ROPE_BASE,
    FFN_KINDS,
    NORM_KINDS,
    NORM_POSITIONS,
    NORM_WEIGHTS,
    POSITIONAL_ENCODING_CHOICES,
    ROPE_PAIRINGS,
    TraceConfig,
)

if TYPE_CHECKING:
    from .tracing import Trace

#: the schema's ceilings of a sentence, of a token list and of one token (the configured limits are lower)
SENTENCE_HARD_MAX = 1_000_000
TOKENS_HARD_MAX = 100_000
TOKEN_HARD_MAX = 1024

#: what a field's value is: a setting's type, or one of the inputs' kinds (text, tokens, an x, weights)
KINDS = ("int", "float", "bool", "choice", "choices", "text", "tokens", "strings", "matrix", "weights", "interventions")


@dataclass(frozen=True)
class Variant:
    """A group of fields that a trace uses together: the answer echoes them (and ``derived``) when ``used``."""

    name: str
    #: the title of the command line's group of options (None: the command's own options)
    title: str | None
    #: whether a trace uses this variant: then its fields are in the answer's config
    used: Callable[[Trace], bool]
    #: the values the answer's config adds after the variant's own fields (derived, not request fields)
    derived: Callable[[Trace], dict[str, Any]] = lambda t: {}
    #: what the answer's schema says of each of the variant's fields in config (None: always there)
    echo_doc: str | None = None
    #: what turns the variant on in a form (the viewer's): (field, value), the value None for "given"; without
    #: one, each of the variant's fields is sent when it is given and not its default
    switch: tuple[str, Any] | None = None


def _always(t: Trace) -> bool:
    return True


VARIANTS: tuple[Variant, ...] = (
    Variant("attention", None, _always),
    Variant("explicit", None, lambda t: False),  # your own x and weights: nothing to echo
    Variant(
        "rope",
        "attention variants",
        lambda t: t.config.rope,
        echo_doc="positional_encoding rope only.",
        switch=("positional_encoding", "rope"),
    ),
    Variant(
        "gqa",
        "attention variants",
        lambda t: t.config.num_kv_heads is not None,
        lambda t: {
            "query_heads_of_kv_head": [list(g) for g in t.config.query_heads_of_kv_head],
            "kv_cache_bytes_per_token": t.config.kv_cache_bytes_per_token,
        },
        echo_doc="Only when num_kv_heads was given.",
    ),
    Variant("window", "attention variants", lambda t: t.config.window is not None, echo_doc="Sliding window only."),
    Variant("cross", "attention variants", lambda t: t.cross, lambda t: {"n_context_tokens": t.n_context}),
    Variant(
        "block",
        "Transformer block (any of these traces a stack of blocks; docs/engine.md)",
        lambda t: t.config.has_block,
        echo_doc="A stack of blocks only.",
    ),
    Variant(
        "constructed",
        "constructed heads (docs/engine.md)",
        lambda t: t.config.constructed,
        echo_doc="Only with a constructed head.",
        switch=("head_weights", None),
    ),
    Variant(
        "lm",
        "language-model head (docs/engine.md)",
        lambda t: t.config.has_lm_head,
        lambda t: {"n_vocabulary": len(t.vocabulary or ())},
        echo_doc="Only with lm_head.",
    ),
    # interventions change the numbers, not the configuration: nothing to echo (the answer's `intervention` says)
    Variant("interventions", "interventions: take the model apart (docs/engine.md)", lambda t: False),
)
_VARIANT_NAMES = tuple(v.name for v in VARIANTS)


@dataclass(frozen=True)
class Field:
    """One request field. Bounds are inclusive but for ``above`` (exclusive); ``None`` is no bound."""

    name: str
    kind: str
    #: the value a request that leaves the field out gets (None: the field may be null, and is by default)
    default: Any
    #: what the contract says of it (openapi.yaml's description)
    doc: str
    variant: str = "attention"
    #: one line on what it does, for the command line's --help and the viewer's hint
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    #: the most items a list may hold; the most characters of a text or of each token
    max_items: int | None = None
    max_chars: int | None = None
    #: what a number counts, if it counts something
    unit: str | None = None
    #: the engine's rule for the value on its own (engine/checks.py and engine/constructed.py), run at the edge
    #: before the schema's own checks, so that HTTP and the engine refuse it alike; and that refusal's type
    rule: Callable[[Any], object] | None = None
    refusal: str | None = None
    #: the limit an operator configures (service/settings.py), refused as "<name>_too_large"
    limit: str | None = None
    #: the command line's option ("--name" by default; a name without dashes is the positional argument; None:
    #: none), its metavar, and the value a switch sets (an option without an argument)
    cli: str | None = ""
    metavar: str | None = None
    switch: Any = None
    #: the viewer's address key (the field's name by default; None: not in the address)
    url: str | None = ""
    #: the value in use, as the answer's config echoes it (None: not echoed)
    echo: Callable[[TraceConfig], Any] | None = None
    #: what the answer's schema says of it in config, when not the variant's ``echo_doc``; null there too
    echo_doc: str | None = None
    echo_nullable: bool = False
    #: the value in use where its variant is not (what a client reads when the answer leaves the field out)
    unused: Any = None
    #: a setting of the layer (TraceConfig has it) rather than an input (the text, x, weights)
    setting: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"field {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.variant not in _VARIANT_NAMES:
            raise ValueError(f"field {self.name}: variant {self.variant!r} is not one of {_VARIANT_NAMES}")

    @property
    def nullable(self) -> bool:
        return self.default is None

    @property
    def flag(self) -> str | None:
        """The command line's option (or positional argument's name), or None."""
        return "--" + self.name.replace("_", "-") if self.cli == "" else self.cli

    @property
    def address(self) -> str | None:
        """The viewer's address key, or None."""
        return self.name if self.url == "" else self.url

    @property
    def echoed(self) -> bool:
        return self.echo is not None

    def echo_description(self) -> str | None:
        return self.echo_doc if self.echo_doc is not None else variant(self.variant).echo_doc

    def value_in_use(self, config: TraceConfig) -> Any:
        assert self.echo is not None, f"{self.name} is not echoed"
        return self.echo(config)

    def public(self) -> dict[str, Any]:
        """The declaration as data (JSON): what the viewer reads."""
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "default": _finite(self.default),
            "variant": self.variant,
            "setting": self.setting,
            "help": self.help,
        }
        for key in ("choices", "minimum", "above", "maximum", "max_items", "unit", "refusal"):
            value = getattr(self, key)
            if value not in (None, ()):
                out[key] = list(value) if isinstance(value, tuple) else _finite(value)
        out["url"] = self.address
        return out


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _attr(name: str) -> Callable[[TraceConfig], Any]:
    """The value in use is TraceConfig's attribute ``name`` (the field's own, or the one it resolves to)."""
    return lambda config: getattr(config, name)


_BLOCK_NAMES = tuple(BLOCK_PRESETS)

#: every field of a trace request, in the order a request (and its schema) lists them
FIELDS: tuple[Field, ...] = (
    Field(
        "sentence",
        "text",
        None,
        setting=False,
        max_chars=SENTENCE_HARD_MAX,
        cli="SENTENCE",
        url="sentence",
        doc="Text to split into tokens: a word is a token, each punctuation mark is its own token. "
        "Give exactly one of `sentence` or `tokens`.",
        help="the text to split into tokens (quote it); or give --tokens",
    ),
    Field(
        "tokens",
        "tokens",
        None,
        setting=False,
        max_items=TOKENS_HARD_MAX,
        max_chars=TOKEN_HARD_MAX,
        url=None,
        doc="Pre-split tokens, used as given. Give exactly one of `sentence` or `tokens`.",
        metavar="TOKEN",
        help="pre-split tokens, used as given, instead of SENTENCE",
    ),
    Field(
        "d_model",
        "int",
        24,
        minimum=1,
        limit="max_d_model",
        unit="features",
        echo=_attr("d_model"),
        doc="Model width; must be divisible by num_heads.",
        metavar="N",
        help="model width",
    ),
    Field(
        "num_heads",
        "int",
        1,
        minimum=1,
        limit="max_heads",
        unit="heads",
        echo=_attr("num_heads"),
        doc="Number of heads h; d_k = d_model / h exactly.",
        cli="--heads",
        metavar="N",
        help="number of heads",
    ),
    Field(
        "seed",
        "int",
        0,
        minimum=0,
        maximum=SEED_MAX,
        echo=_attr("seed"),
        doc="Seed for embeddings and weights.",
        metavar="N",
        help="seed of the embeddings and weights",
    ),
    Field(
        "scale",
        "bool",
        True,
        echo=_attr("scale"),
        doc="Divide scores by √d_k (true) or by 1 (false).",
        cli="--no-scale",
        switch=False,
        help="do not divide the scores by √d_k",
    ),
    Field(
        "causal",
        "bool",
        False,
        echo=_attr("causal"),
        doc="Mask keys after each query (decoder-style).",
        switch=True,
        help="mask every key after its query",
    ),
    Field(
        "positional_encoding",
        "choice",
        "sinusoidal",
        choices=POSITIONAL_ENCODING_CHOICES,
        url="pe",
        echo=_attr("positional_encoding"),
        doc="Sinusoidal encodings added to the embeddings; none; or rope: nothing added to x, and q and k "
        "rotated per head by their position (the q_rotated and k_rotated stages; d_k must be even).",
        cli="--rope",
        switch="rope",
        help="rotary position embeddings (RoPE) instead of sinusoidal encodings: q and k are rotated by position",
    ),
    Field(
        "rope_base",
        "float",
        DEFAULT_ROPE_BASE,
        variant="rope",
        above=1,
        maximum=ROPE_BASE_MAX,
        rule=check_rope_base,
        refusal="invalid_size",
        echo=_attr("rope_base"),
        doc="RoPE's frequency base (10000 in RoFormer and Llama 2, 500000 in Llama 3); used with "
        "positional_encoding rope, and checked with any encoding (a wrong value is a 422 `invalid_size` even "
        "where it would not be used).",
        metavar="B",
        help="RoPE's frequency base (500000 in Llama 3)",
    ),
    Field(
        "rope_pairing",
        "choice",
        "rotate_half",
        variant="rope",
        choices=tuple(ROPE_PAIRINGS),
        rule=lambda v: check_choice("rope_pairing", v, tuple(ROPE_PAIRINGS)),
        refusal="invalid_size",
        echo=_attr("rope_pairing"),
        doc="Which coordinates RoPE rotates together: rotate_half pairs j and j + d_k/2 (GPT-NeoX, Llama, "
        "Hugging Face's rotate_half); interleaved pairs 2j and 2j + 1 (RoFormer, the paper). Used with "
        "positional_encoding rope, and checked with any encoding (`invalid_size`).",
        help="RoPE's pairs: rotate_half (Llama) or interleaved (RoFormer)",
    ),
    Field(
        "num_kv_heads",
        "int",
        None,
        variant="gqa",
        minimum=1,
        unit="heads",
        rule=check_kv_heads_value,
        refusal="invalid_size",
        echo=_attr("kv_heads"),
        url="kv",
        doc="Grouped-query attention: how many K/V heads the num_heads query heads share (a divisor of "
        "num_heads; 1 is multi-query attention); null means num_heads (multi-head attention).",
        cli="--kv-heads",
        metavar="G",
        help="grouped-query attention: G K/V heads shared by the query heads (1 = multi-query)",
    ),
    Field(
        "window",
        "int",
        None,
        variant="window",
        minimum=1,
        unit="keys",
        rule=check_window_size,
        refusal="invalid_size",
        echo=_attr("window"),
        doc="Sliding-window attention (Mistral, Longformer), with causal: true: each query sees at most "
        "`window` keys, its own and the window − 1 before it.",
        metavar="W",
        help="a sliding window, with --causal: each query sees at most W keys, its own included",
    ),
    # Constructed heads (docs/engine.md, "Constructed heads").
    Field(
        "head_weights",
        "choices",
        None,
        variant="constructed",
        choices=constructed.HEAD_KINDS,
        max_items=TOKENS_HARD_MAX,
        rule=lambda v: raise_all(constructed.kind_problems(v)),
        refusal="unknown_head_kind",
        echo=lambda config: list(config.head_kinds),
        url="hw",
        echo_doc="Only with a constructed head: each head's kind.",
        doc="Each head's weights, one kind per head: seeded (the default), or a head built by hand with a "
        "known job: previous_token, same_token (earlier copies of the query's token, with causal), "
        "first_token, induction (num_layers 2 or more). Any constructed head lays x out in subspaces (token, "
        "previous token, 0, a position code, 1). Null: every head seeded.",
        metavar="KIND",
        help="each head's weights, one per head: seeded, previous_token, same_token, first_token, "
        "induction (heads built by hand with a known job)",
    ),
    Field(
        "sharpness",
        "float",
        constructed.DEFAULT_SHARPNESS,
        variant="constructed",
        above=0,
        maximum=constructed.SHARPNESS_MAX,
        rule=lambda v: raise_all(constructed.sharpness_problems(v)),
        refusal="invalid_size",
        echo=_attr("sharpness"),
        doc="The constructed heads' scores are sharpness × their closed form: how peaked their patterns are.",
        metavar="S",
        help="the constructed heads' scores are S × their closed form: higher is more peaked",
    ),
    # Cross-attention: the keys and values from a context.
    Field(
        "context_sentence",
        "text",
        None,
        variant="cross",
        setting=False,
        max_chars=SENTENCE_HARD_MAX,
        url="context",
        doc="Cross-attention: the queries come from the sentence, the keys and values from this context "
        "(an encoder's sentence), with its own embeddings and positions. No causal mask, window or RoPE.",
        cli="--context",
        metavar="TEXT",
        help="cross-attention: the keys and values come from this context sentence",
    ),
    Field(
        "context_tokens",
        "tokens",
        None,
        variant="cross",
        setting=False,
        max_items=TOKENS_HARD_MAX,
        max_chars=TOKEN_HARD_MAX,
        url="ctok",
        cli=None,
        doc="Cross-attention's context, pre-split. Give at most one of context_sentence or context_tokens.",
    ),
    Field(
        "context_input",
        "matrix",
        None,
        variant="cross",
        setting=False,
        url=None,
        cli=None,
        doc="Cross-attention with your own x: the context's x [context token, d_model], given together with input.",
    ),
    # Your own x and weights.
    Field(
        "input",
        "matrix",
        None,
        variant="explicit",
        setting=False,
        url=None,
        cli=None,
        doc="Bring your own input x [token, d_model] instead of the seeded embeddings plus positional "
        "encodings (the token_embedding and positional_encoding stages are then absent). The tokens still "
        "label the rows.",
    ),
    Field(
        "parameters",
        "weights",
        None,
        variant="explicit",
        setting=False,
        url=None,
        cli=None,
        doc="Bring your own weights instead of the seeded ones: W_Q [head, d_k, d_model], W_K and W_V "
        "[kv head, d_k, d_model] (kv heads = num_kv_heads, or num_heads) and W_O [d_model, num_heads·d_k].",
    ),
    # A stack of Transformer blocks around the attention (docs/engine.md, "The Transformer block"): any of these
    # fields but num_layers asks for one. With none of them the answer is the single attention layer's.
    Field(
        "num_layers",
        "int",
        1,
        variant="block",
        minimum=1,
        maximum=MAX_LAYERS,
        unit="blocks",
        rule=check_num_layers,
        refusal="invalid_size",
        echo=_attr("num_layers"),
        url="layers",
        unused=1,
        doc="How many Transformer blocks are stacked; more than 1 needs a block field (`layers_need_block` "
        "otherwise). Every per-layer stage gains a leading `layer` axis; `residual_stream` [depth, token, "
        "d_model] holds the stack's input and each layer's output. The size limits count every layer's "
        "numbers and weights.",
        cli="--layers",
        metavar="N",
        help="how many blocks are stacked (more needs a block option)",
    ),
    Field(
        "block",
        "choice",
        None,
        variant="block",
        choices=_BLOCK_NAMES,
        rule=lambda v: check_optional_choice("block", v, _BLOCK_NAMES),
        refusal="invalid_size",
        echo=_attr("block"),
        echo_doc="A stack of blocks only: the preset asked for, or null.",
        echo_nullable=True,
        doc="Trace a stack of blocks of this preset: `vaswani2017` (post-norm LayerNorm, ReLU, d_ff "
        "4·d_model), `gpt2` (pre-norm LayerNorm, GELU's tanh approximation, a final norm; sets causal: true "
        "unless given), `llama` (pre-norm RMSNorm, SwiGLU with Llama's d_ff rounding, a final norm; sets "
        "positional_encoding rope and causal: true unless given; GQA with num_kv_heads). The block fields "
        "below override the preset's choices; without a preset they override vaswani2017's.",
        help="a preset: vaswani2017 (post-norm LayerNorm, ReLU), gpt2 (pre-norm LayerNorm, GELU tanh; sets "
        "--causal), llama (pre-norm RMSNorm, SwiGLU; sets --causal and --rope)",
    ),
    Field(
        "norm",
        "choice",
        None,
        variant="block",
        choices=NORM_KINDS,
        rule=lambda v: check_optional_choice("norm", v, NORM_KINDS),
        refusal="invalid_size",
        echo=_attr("norm_kind"),
        doc="The block's norms: layer_norm (mean and biased variance over the features, ε inside the square "
        "root) or rms_norm (mean square); null: the preset's (layer_norm without one).",
        help="the norms (default: the preset's)",
    ),
    Field(
        "norm_position",
        "choice",
        None,
        variant="block",
        choices=NORM_POSITIONS,
        rule=lambda v: check_optional_choice("norm_position", v, NORM_POSITIONS),
        refusal="invalid_size",
        echo=lambda config: "pre" if config.pre_norm else "post",
        doc="post (2017: x = Norm(x + Sublayer(x))) or pre (GPT-2, Llama: x = x + Sublayer(Norm(x)), and a final "
        "norm); null: the preset's (post without one).",
        help="post (2017) or pre (GPT-2, Llama: and a final norm); default: the preset's",
    ),
    Field(
        "ffn",
        "choice",
        None,
        variant="block",
        choices=FFN_KINDS,
        rule=lambda v: check_optional_choice("ffn", v, FFN_KINDS),
        refusal="invalid_size",
        echo=_attr("ffn_kind"),
        doc="The feed-forward network's activation: relu, gelu (exact, erf), gelu_tanh (the tanh approximation) "
        "or swiglu (SiLU of the gate W_1 times the up projection W_3); null: the preset's.",
        help="the feed-forward network's activation (default: the preset's)",
    ),
    Field(
        "d_ff",
        "int",
        None,
        variant="block",
        minimum=1,
        maximum=D_FF_MAX,
        unit="units",
        rule=check_d_ff,
        refusal="invalid_size",
        echo=_attr("ff_width"),
        echo_doc="A stack of blocks only: the feed-forward network's width in use.",
        doc="The feed-forward network's inner width; null: 4·d_model, and for swiglu Llama's ⌊8·d_model/3⌋ "
        "rounded up to a multiple of 256.",
        metavar="N",
        help="the feed-forward network's width (default 4·d_model; swiglu: Llama's rounding)",
    ),
    Field(
        "norm_eps",
        "float",
        None,
        variant="block",
        above=0,
        maximum=1,
        rule=check_norm_eps,
        refusal="invalid_size",
        echo=_attr("eps"),
        echo_doc="A stack of blocks only: the norms' ε in use.",
        doc="The norms' ε; null: the preset's (1e-5; llama 1e-6).",
        metavar="E",
        help="the norms' ε (default: the preset's)",
    ),
    Field(
        "norm_weights",
        "choice",
        None,
        variant="block",
        choices=NORM_WEIGHTS,
        rule=lambda v: check_optional_choice("norm_weights", v, NORM_WEIGHTS),
        refusal="invalid_size",
        echo=lambda config: "seeded" if config.seeded_norm else "unit",
        doc="The norms' γ and β: unit (γ = 1, β = 0, the default, as torch initialises a norm) or seeded (drawn "
        "from the seed).",
        help="unit (γ = 1, β = 0; the default) or seeded",
    ),
    # The language-model head (docs/engine.md, "The language-model head"): a stack's last step, opt-in. These
    # three fields, and /trace's generate, top_k, top_p and sample_seed, are its whole request.
    Field(
        "lm_head",
        "choice",
        None,
        variant="lm",
        choices=LM.LM_HEADS,
        rule=lambda v: check_optional_choice("lm_head", v, LM.LM_HEADS),
        refusal="invalid_size",
        echo=_attr("lm_head"),
        url="lm",
        doc="End the stack with a language-model head (a block field is needed): tied (W_U = the "
        "vocabulary's token embeddings, as GPT-2 ties them) or seeded (its own rows, seeded per token). Adds the "
        "stages unembedding [vocab, d_model], logits [token, vocab] and next_token_probs [vocab] (the token after "
        "the sentence), and `vocabulary`, the token of each column. Null: no head.",
        help="end the stack with a language-model head: tied (to the token embeddings, as GPT-2) or seeded",
    ),
    Field(
        "temperature",
        "float",
        1.0,
        variant="lm",
        minimum=LM.TEMPERATURE_MIN,
        maximum=LM.TEMPERATURE_MAX,
        rule=LM.check_temperature,
        refusal="invalid_size",
        echo=_attr("temperature"),
        url="temp",
        doc="next_token_probs = softmax(logits[n − 1] / temperature); with lm_head only.",
        metavar="T",
        help="next_token_probs = softmax(logits / T) (with --lm-head)",
    ),
    Field(
        "candidates",
        "strings",
        None,
        variant="lm",
        max_items=LM.MAX_VOCABULARY,
        max_chars=TOKEN_HARD_MAX,
        rule=lambda v: LM.check_candidates(v) if isinstance(v, list) and all(isinstance(t, str) for t in v) else None,
        refusal="invalid_size",
        url="cand",
        doc="Tokens the vocabulary holds besides the sentence's own: the vocabulary is the sentence's "
        "distinct tokens in order of first appearance, then these (those not already in it), in order; at most "
        f"{LM.MAX_VOCABULARY} in all. With lm_head only.",
        metavar="TOKEN",
        help="tokens the vocabulary holds besides the sentence's own (with --lm-head)",
    ),
    # Interventions (docs/engine.md, "Interventions"): these three fields, kept together.
    Field(
        "interventions",
        "interventions",
        None,
        variant="interventions",
        setting=False,
        max_items=IV.MAX_INTERVENTIONS,
        url=None,
        cli=None,  # the command line's --ablate L.H writes it
        doc="Take the model apart: each entry replaces one activation (zero, mean, or patched from "
        "patch_sentence) and every later stage is computed from the replaced value, as a PyTorch forward hook "
        "would. The answer is the intervened trace, with `intervention`: the baseline request and its digest, "
        "the baseline's key stage, each stage's largest change per layer, and with lm_head the target token's "
        "logit and probability before and after. Not with inject_bug, decode or generate.",
    ),
    Field(
        "patch_sentence",
        "text",
        None,
        variant="interventions",
        setting=False,
        max_chars=SENTENCE_HARD_MAX,
        url=None,
        cli=None,  # the command line's --patch-from, which goes with --ablate
        metavar="SENTENCE",
        doc="With an intervention of kind patch: the second input (a clean or corrupted sentence with "
        "as many tokens as the sentence), run clean with the same weights; patched activations come from it.",
        help="patch each --ablate head from this sentence's clean run (as many tokens) instead of zeroing it",
    ),
    Field(
        "target_token",
        "text",
        None,
        variant="interventions",
        setting=False,
        max_chars=TOKEN_HARD_MAX,
        url=None,
        cli="--target",
        metavar="TOKEN",
        doc="With interventions and lm_head: the vocabulary token whose logit and probability "
        "`intervention.target` follows; null: the baseline's most probable next token.",
        help="with --lm-head: the token whose probability the intervention's effect follows",
    ),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
#: the settings of the layer, in request order: TraceConfig's fields of the same names
SETTINGS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.setting)


def variant(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def of_variant(name: str) -> Iterator[Field]:
    return (f for f in FIELDS if f.variant == name)


def config_echo(t: Trace, between: Callable[[str], dict[str, Any]] = lambda name: {}) -> dict[str, Any]:
    """The answer's ``config`` from the declaration: each used variant's fields as in use, then what it derives
    (``Variant.derived``), then ``between(variant name)`` (what the answer adds there: its request options, the
    sizes)."""
    doc: dict[str, Any] = {}
    for v in VARIANTS:
        if v.used(t):
            doc |= {f.name: f.value_in_use(t.config) for f in of_variant(v.name) if f.echoed}
            doc |= v.derived(t)
        doc |= between(v.name)
    return doc


def checked_config(
    settings: dict[str, Any],
    *,
    max_tokens: int,
    cross: bool = False,
    input_given: bool = False,
    context_input_given: bool = False,
    parameters_given: bool = False,
    decode: bool = False,
    bug: str | None = None,
) -> TraceConfig:
    """A request's TraceConfig from its ``settings`` (every name of :data:`SETTINGS`, a preset's choices applied),
    with its sizes and every conflict between its settings and its other parts checked: the first EngineError
    raised carries the others."""
    s = settings
    head_dim(s["d_model"], s["num_heads"])
    kv_heads(s["num_heads"], s["num_kv_heads"])
    has_block = any(s[name] is not None for name in BLOCK_FIELDS)
    # Every conflict between the variants' settings at once (then the configuration builds).
    check_variants(
        d_model=s["d_model"],
        num_heads=s["num_heads"],
        causal=s["causal"],
        window=s["window"],
        positional_encoding=s["positional_encoding"],
        cross=cross,
        input_given=input_given,
        context_input_given=context_input_given,
        decode=decode,
        bug=bug,
        block=has_block,
        num_layers=s["num_layers"],
        parameters_given=parameters_given,
    )
    config = TraceConfig(**s, max_tokens=max_tokens)
    if config.head_weights is not None:  # constructed heads: their own x and weights (engine.constructed)
        raise_all(
            constructed.trace_conflicts(
                constructed=config.constructed, input_given=input_given, parameters_given=parameters_given, cross=cross
            )
        )
    return config


#: /trace's generation options: not the layer's configuration (the trace is the same with or without them) but
#: what its language-model head does after it, so /trace's request alone takes them (service/routes/trace.py);
#: the command line's ``generate`` and the viewer's next-token panel read their bounds and help from here
GENERATE_OPTIONS: tuple[Field, ...] = (
    Field(
        "generate",
        "int",
        None,
        variant="lm",
        setting=False,
        minimum=1,
        maximum=LM.MAX_GENERATE,
        url=None,
        cli="--tokens",
        metavar="N",
        doc="Also return `generation`: this many tokens generated after the sentence by the stack and its "
        "language-model head (lm_head, causal), each traced through a KV cache per layer: the chosen token, its "
        "probability, the candidates, the logits and probabilities it was drawn from, and its row of attention "
        "in every layer. Greedy unless sample_seed is given. The tokens come from the vocabulary.",
        help="how many tokens",
    ),
    Field(
        "top_k",
        "int",
        None,
        variant="lm",
        setting=False,
        minimum=1,
        maximum=LM.MAX_VOCABULARY,
        url=None,
        metavar="K",
        doc="With generate: draw only among the top_k most probable tokens (null: all).",
        help="sample only among the K most probable",
    ),
    Field(
        "top_p",
        "float",
        None,
        variant="lm",
        setting=False,
        above=0,
        maximum=1,
        url=None,
        metavar="P",
        doc="With generate: then only among the fewest most probable tokens whose probabilities reach "
        "top_p (nucleus sampling; null: all).",
        help="sample only among the fewest most probable tokens reaching P",
    ),
    Field(
        "sample_seed",
        "int",
        None,
        variant="lm",
        setting=False,
        minimum=0,
        maximum=SEED_MAX,
        url=None,
        cli="--seed",
        metavar="S",
        doc="With generate: sample (each step's uniform number from SHAKE-256 of this seed and the step, "
        "the same on every machine) instead of choosing greedily.",
        help="sample with this seed (default: greedy, the most probable token)",
    ),
)


def generate_option(name: str) -> Field:
    """One of /trace's generation options (GENERATE_OPTIONS) by name."""
    return next(f for f in GENERATE_OPTIONS if f.name == name)


def viewer_declaration() -> dict[str, Any]:
    """The declaration as the viewer reads it (``GET /static/fields.js``): each field that the address carries,
    with its type, bounds, default, help and address key, in request order; and /trace's generation options'
    declarations (the next-token panel's inputs take their bounds, its generate step asks for no more tokens
    than generate's maximum)."""
    return {
        "fields": [f.public() for f in FIELDS if f.address is not None],
        "switches": {v.name: list(v.switch) for v in VARIANTS if v.switch is not None},
        "block_presets": {
            name: {"positional_encoding": p.positional_encoding, "causal": p.causal}
            for name, p in BLOCK_PRESETS.items()
        },
        "generate_options": [f.public() for f in GENERATE_OPTIONS],
    }
