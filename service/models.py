"""The contract's shared pieces, as pydantic v2 models: what every route's request and answer is built of.

* ``TraceSpec``: one sentence (or pre-split tokens) and the layer's
  configuration, every variant's field included; each endpoint's request
  extends it (``TraceRequest`` in ``service/routes/trace.py``, ``CheckRequest``
  in ``service/routes/check.py``, and /explain's and /export's on /trace's),
  and ``run_trace`` gives its engine trace;
* ``engine_rules``: the engine's own checks at the edge, each refusal a 422
  entry at its field;
* the answers' shared parts (``ConfigOut``, ``TokenOut``, ``InjectedBug``,
  ``Problem``) and ``omitted``, how an output field that is left out where it
  does not apply is published.

The models are the single source of truth for request validation and for
``components.schemas`` in openapi.yaml (``scripts/gen-openapi`` writes them
there from each route module's models; a test fails on any drift).

Limits that operators configure (max tokens, d_model, heads, total values) are
checked here too, from the validation context, so every problem, static or
configured, comes back in one ``errors`` list with a JSON pointer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, cast

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo,
                      ValidatorFunctionWrapHandler, WrapValidator, create_model, field_validator, model_validator)
from pydantic_core import PydanticCustomError

import engine
from engine import BUG_NAMES, EngineError, Token, TraceConfig, fields
from engine import lm as LM
from engine.bugs import BLOCK_BUG_NAMES, LM_BUG_NAMES
from engine.decoding import decode_value_count, generate_value_count, generate_work
from engine.errors import raise_all
from engine import interventions as IV
from engine.checks import (
    MAX_EXPLICIT_VALUE,
    MAX_LAYERS,
    check_block_cost,
    check_input_shape,
    check_one_context,
    check_one_source,
    check_parameter_shapes,
    check_sentence,
    check_token_list,
    check_token_text,
    check_trace_size,
    split_context,
    split_tokens,
)
from engine.layer import (
    ALL_STAGE_IDS,
    BLOCK_FIELDS,
    BLOCK_STAGE_IDS,
    LM_STAGE_IDS,
    preset_fields,
    trace_value_count,
)
from engine.params import explicit_parameters

from .problems import problem_entry
from .settings import Settings

#: a stage id a request may name: engine 1.0's and its variants' (ALL_STAGE_IDS), then a stack of blocks' own
#: (BLOCK_STAGE_IDS, which only a trace with a block field computes)
STAGE_ID_CHOICES: tuple[str, ...] = (*ALL_STAGE_IDS, *BLOCK_STAGE_IDS, *LM_STAGE_IDS)


def _quoted(choices: tuple[str, ...]) -> str:
    """Choices as pydantic's literal_error lists them: 'a', 'b' or 'c'."""
    names = [repr(c) for c in choices]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def has_block_field(info: ValidationInfo) -> bool:
    """Whether the request being validated gave a block field (TraceSpec's, validated before what names stages)."""
    data = info.data or {}
    return any(data.get(name) is not None for name in BLOCK_FIELDS)


def _names_of_the_requests_kind(one_layer: tuple[str, ...], stack: tuple[str, ...]) -> WrapValidator:
    """An unknown name's literal_error lists the names of the request's kind: a request without a block field
    is answered as before the block existed, word for word; a stack's adds the block's names."""
    one_layer_text, stack_text = _quoted(one_layer), _quoted(stack)

    def known(v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> str:
        try:
            return handler(v)
        except ValidationError:
            expected = stack_text if has_block_field(info) else one_layer_text
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected}) from None

    return WrapValidator(known)


StageId = Annotated[Literal[STAGE_ID_CHOICES],  # type: ignore[valid-type]  # Literal of a run-time tuple
                    _names_of_the_requests_kind(ALL_STAGE_IDS, STAGE_ID_CHOICES)]



# Unicode's Cc (C0 and C1 controls, but tab, newline and carriage return are fine) and Cs (lone
# surrogates): fixed ranges, found with one C scan instead of a category lookup per character.
_BAD_CHARACTER = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _bad_characters(text: str) -> str | None:
    """Describe the first character no tokenizer should see, or None."""
    found = _BAD_CHARACTER.search(text)
    if found is None:
        return None
    i, ch = found.start(), found.group()
    if unicodedata.category(ch) == "Cs":
        return f"a lone surrogate U+{ord(ch):04X} at character {i}; send valid Unicode"
    return f"a control character U+{ord(ch):04X} at character {i}; remove it"


def _refuse_bad_characters(field: str, i: int, text: str) -> None:
    """A list's item ``i`` of ``field`` with a character no tokenizer should see: a 422 naming it."""
    bad = _bad_characters(text)
    if bad:
        raise PydanticCustomError("bad_character", "{field}[{i}] contains {what}", {"field": field, "i": i, "what": bad})


if TYPE_CHECKING:  # mypy cannot read a Literal built from the engine's tuples: str
    BugName: TypeAlias = str
    AnyBugName: TypeAlias = str
else:
    BugName = Literal[BUG_NAMES]
    #: a name /check's diagnosis may give: the attention's known bugs, a stack of blocks' own (BLOCK_BUGS), then
    #: the language-model head's
    AnyBugName = Literal[BUG_NAMES + BLOCK_BUG_NAMES + LM_BUG_NAMES]

#: inject_bug's names: the attention's known bugs, and a stack of blocks' own (which the engine's refusal rule
#: refuses without a block field, saying to add one), and the language-model head's (refused without lm_head); an
#: unknown one's message lists the request's kind's (a stack's: the attention's and the block's, as before the head)
InjectableBugName = Annotated[AnyBugName, _names_of_the_requests_kind(BUG_NAMES, BUG_NAMES + BLOCK_BUG_NAMES)]


#: a number of an explicit input or weight: bounded, so that products of them stay within float64
BoundedNumber = Annotated[float, Field(ge=-MAX_EXPLICIT_VALUE, le=MAX_EXPLICIT_VALUE)]


class _EngineRules:
    """``with engine_rules():`` (a class, not @contextmanager: a generator per use cost ~1.5 µs, 3–4 per request)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> Literal[False]:
        if isinstance(error, EngineError):
            ctx: dict[str, Any] = {"message": error.message, "pointer": error.pointer}
            if error.also:  # every other problem found with it: problems.validation_problem lists them too
                ctx["also"] = [problem_entry(e) for e in error.also]
            raise PydanticCustomError(error.code, "{message}", ctx) from None
        return False


_ENGINE_RULES = _EngineRules()


def engine_rules() -> _EngineRules:
    """Run the engine's own checks at the edge: an EngineError becomes this field's 422 entry."""
    return _ENGINE_RULES


_Matrix3 = list[list[list[BoundedNumber]]]


class ParametersIn(BaseModel):
    """Caller-supplied weights of one multi-head attention layer."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    W_Q: _Matrix3 = Field(description="[head, d_k, d_model]")
    W_K: _Matrix3 = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or num_heads")
    W_V: _Matrix3 = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or num_heads")
    W_O: list[list[BoundedNumber]] = Field(description="[d_model, num_heads·d_k]")



class InterventionIn(BaseModel):
    """One intervention (docs/engine.md, "Interventions"): which activation, where, and what replaces it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    target: Literal[IV.TARGETS] = Field(  # type: ignore[valid-type]  # a Literal of the engine's tuple
        description="head_output: a head's context (before W_O) [token, d_k]; head_pattern: its attention weights "
        "[query, key]; mlp_output: the feed-forward network's output; residual: the residual stream at depth "
        "`layer` (layer l's input; num_layers is the last layer's output). The last two need a block.")
    layer: int = Field(ge=0, le=MAX_LAYERS, description="The layer (the depth, for residual), from 0.")
    kind: Literal[IV.KINDS] = Field(  # type: ignore[valid-type]  # a Literal of the engine's tuple
        default="zero", description="zero; mean (the mean over the sentence's positions; for head_pattern, uniform "
        "over the keys each query may attend to: a pattern is not zeroed); patch (the same activation of "
        "patch_sentence's clean run).")
    head: int | None = Field(default=None, ge=0, description="The head, for head_output and head_pattern.")
    positions: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, max_length=fields.TOKENS_HARD_MAX,
        description="The token positions (query rows, for head_pattern) replaced; null: every position.")


def _annotation(f: fields.Field, *, echo: bool = False) -> Any:
    """A declared field's Python type (pydantic's schema and validation follow from it): the request's, with its
    bounds (``Annotated``), or the answer echo's (the type alone)."""
    kind = f.kind
    if kind == "choice":
        t: Any = Literal[f.choices]
    elif kind == "choices":
        t = list[Literal[f.choices]]  # type: ignore[name-defined]  # a Literal of the declaration's choices, built at run time
    elif kind == "text":
        t = Annotated[str, Field(min_length=1, max_length=f.max_chars)]
    elif kind in ("tokens", "strings"):
        t = list[Annotated[str, Field(min_length=1, max_length=f.max_chars)]]
    else:
        t = {"int": int, "float": float, "bool": bool, "matrix": list[list[BoundedNumber]],
             "weights": ParametersIn, "interventions": list[InterventionIn]}[kind]
    return t | None if f.nullable or echo else t


def _field_info(f: fields.Field) -> Any:
    """A declared field's pydantic Field: its default, bounds and description."""
    bounds: dict[str, Any] = {"ge": f.minimum, "gt": f.above, "le": f.maximum, "max_length": f.max_items,
              "min_length": 1 if f.kind in ("tokens", "strings", "interventions") else None}
    return Field(default=f.default, description=f.doc, **{k: v for k, v in bounds.items() if v is not None})


def generate_option_field(name: str) -> Any:
    """One of /trace's generation options (engine/fields.py, GENERATE_OPTIONS) as TraceRequest's pydantic Field."""
    return _field_info(fields.generate_option(name))


#: the fields the engine checks itself (each Field's ``rule``), before the schema's checks (TraceSpec._engine_rule)
_FIELD_RULES: dict[str, Callable[[Any], object]] = {f.name: f.rule for f in fields.FIELDS if f.rule is not None}
#: the fields an operator bounds (service/settings.py), each Field's ``limit``
_LIMITS: dict[str, str] = {f.name: f.limit for f in fields.FIELDS if f.limit is not None}

#: every declared request field (engine/fields.py), in request order, as pydantic builds a model from it
_SpecFields: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "TraceSpec", __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False),
    **{f.name: (_annotation(f), _field_info(f)) for f in fields.FIELDS})


# Its fields are engine/fields.py's declaration (_SpecFields); this class adds what validates them together.
# allow_inf_nan=False: the JSON parser accepts NaN and Infinity literals, which no float here may be.
class TraceSpec(_SpecFields):  # type: ignore[valid-type,misc]
    """One sentence (or pre-split tokens) and the layer's configuration: shared by /trace and /check."""

    #: numbers the trace will hold, known once validated (bounds batches too)
    _value_count: int = PrivateAttr(default=0)
    #: the engine's configuration and token count, known once validated
    _config: TraceConfig | None = PrivateAttr(default=None)
    _tokens: list[Token] = PrivateAttr(default_factory=list)
    _context: list[Token] | None = PrivateAttr(default=None)
    _patch: list[Token] | None = PrivateAttr(default=None)

    # The fields with an engine rule (the variants', the block's, the constructed heads') are checked by it
    # before the schema's checks, so that HTTP and the engine refuse them alike: the engine's type and message
    # (docs/engine.md, "Errors of the variants"). The schema keeps its bounds, which document the same ranges.
    @field_validator(*_FIELD_RULES, mode="before")
    @classmethod
    def _engine_rule(cls, v: Any, info: ValidationInfo) -> Any:
        with engine_rules():
            _FIELD_RULES[str(info.field_name)](v)
        return v

    # The limits an operator configures, after the schema's checks.
    @field_validator(*_LIMITS)
    @classmethod
    def _configured_limit(cls, v: int, info: ValidationInfo) -> int:
        name = str(info.field_name)
        limit = getattr(settings_of(info), _LIMITS[name])
        if v > limit:
            raise PydanticCustomError(
                f"{name}_too_large", f"{name} {{value}} is above the limit of {{limit}}", {"value": v, "limit": limit}
            )
        return v

    # Before the schema's own checks, so that an empty or blank text gets the engine's type and message
    # (empty_sentence, empty_tokens, blank_token), as the engine gives them; text the schema refuses
    # anyway (not a string, over the schema's ceilings) is left to it.
    @field_validator(*(f.name for f in fields.FIELDS if f.kind == "text"), mode="before")
    @classmethod
    def _sentence_text(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, str) or len(v) > fields.SENTENCE_HARD_MAX:
            return v
        field = cast(str, info.field_name)  # a field validator's info names its field
        what = field.replace("_", " ")
        limit = settings_of(info).max_sentence_chars
        if len(v) > limit:
            raise PydanticCustomError(
                "sentence_too_long",
                "the {what} has {length} characters; the limit is {limit}",
                {"what": what, "length": len(v), "limit": limit},
            )
        bad = _bad_characters(v)
        if bad:
            raise PydanticCustomError("bad_character", "the {field} contains {what}", {"field": what, "what": bad})
        with engine_rules():
            check_sentence(v, field=field)
        return v

    @field_validator(*(f.name for f in fields.FIELDS if f.kind == "strings"), mode="before")
    @classmethod
    def _string_texts(cls, v: Any, info: ValidationInfo) -> Any:
        field = cast(str, info.field_name)  # a field validator's info names its field
        for i, t in enumerate(v if isinstance(v, list) else []):
            if isinstance(t, str):
                _refuse_bad_characters(field, i, t)
        return v

    @field_validator(*(f.name for f in fields.FIELDS if f.kind == "tokens"), mode="before")
    @classmethod
    def _token_texts(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, list) or len(v) > fields.TOKENS_HARD_MAX or not all(
                isinstance(t, str) and len(t) <= fields.TOKEN_HARD_MAX for t in v):
            return v
        field = cast(str, info.field_name)  # a field validator's info names its field
        with engine_rules():
            check_token_list(v, settings_of(info).max_tokens, field=field)
        for i, t in enumerate(v):
            _refuse_bad_characters(field, i, t)
            with engine_rules():
                check_token_text(i, t, field=field)
        return v

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> TraceSpec:
        settings = settings_of(info)
        cross = self.context_sentence is not None or self.context_tokens is not None
        with engine_rules():
            check_one_source(self.sentence, self.tokens)
            check_one_context(self.context_sentence, self.context_tokens)
            # What a block's preset sets outside it (llama's RoPE, gpt2's and llama's causal mask), for the
            # fields the request leaves out.
            values = [getattr(self, name) for name in fields.SETTINGS]
            preset = preset_fields(self.block, self.model_fields_set)
            if preset:
                values = [preset.get(name, v) for name, v in zip(fields.SETTINGS, values)]
            config = _checked_config(
                *(tuple(v) if isinstance(v, list) else v for v in values),  # hashable, as the cache needs
                max_tokens=settings.max_tokens, cross=cross, input_given=self.input is not None,
                context_input_given=self.context_input is not None, parameters_given=self.parameters is not None,
                decode=getattr(self, "decode", False), bug=getattr(self, "inject_bug", None))
            # Count tokens now (the tokenizer stops at limit + 1), so the size of
            # the whole trace is known, and bounded, before any array exists.
            tokens = split_tokens(sentence=self.sentence, tokens=self.tokens, max_tokens=settings.max_tokens)
            context = split_context(context_sentence=self.context_sentence, context_tokens=self.context_tokens,
                                    max_tokens=settings.max_tokens)
            n, m = len(tokens), None if context is None else len(context)
            if self.input is not None:
                check_input_shape(self.input, n, self.d_model)
            if self.context_input is not None and m is not None:
                check_input_shape(self.context_input, m, self.d_model, "context_input")
            if self.parameters is not None:
                check_parameter_shapes(dict(self.parameters), self.d_model, self.num_heads, self.num_kv_heads)
            n_vocab = None
            if config.has_lm_head:
                n_vocab = len(LM.vocabulary([t.text for t in tokens], config.candidates))
                LM.check_vocabulary_size(n_vocab)
            patch = self._check_interventions(config, tokens, m, settings.max_tokens)
            count = trace_value_count(config, n, with_parameters=getattr(self, "include_parameters", False),
                                      n_context=m, n_vocab=n_vocab)
            decoding = decode_value_count(config, n) if getattr(self, "decode", False) else 0
            generating = getattr(self, "generate", None)
            generated = 0
            if generating is not None:
                raise_all([*LM.generate_conflicts(lm_head=config.lm_head, causal=config.causal, n=n,
                                                  generate=generating, max_tokens=settings.max_tokens),
                           *LM.generate_input_conflicts(input_given=self.input is not None,
                                                        bug=getattr(self, "inject_bug", None))])
                generated = generate_value_count(config, n, n_vocab or 0, generating)
            count += decoding + generated
            check_trace_size(count, settings.max_trace_values, n=n, d_model=self.d_model, num_heads=self.num_heads,
                             n_context=m, decode_values=decoding, generate_values=generated)
            if self.interventions is not None:  # the baseline's trace too, and the patch's second input's
                count += count * (1 + (patch is not None))
            if config.has_block:  # and every layer's weights, generated before anything is computed (and generation)
                work = 0 if generating is None else generate_work(config, n, n_vocab or 0, generating)
                check_block_cost(count + work, config.n_parameters, settings.max_request_cost,
                                 num_layers=config.num_layers)
        # One update of the private values: each assignment through pydantic's __setattr__ costs ~0.3 µs.
        private = self.__pydantic_private__  # a model with private attributes has their dict
        private.update(_config=config, _tokens=tokens, _context=context, _value_count=count, _patch=patch)
        return self

    def _check_interventions(self, config: TraceConfig, tokens: list[Token], m: int | None, max_tokens: int
                             ) -> list[Token] | None:
        """The interventions' rules (engine.interventions), under engine_rules; the patch's tokens, split."""
        ivs = self.engine_interventions()
        raise_all(IV.intervention_conflicts(
            interventions=bool(ivs), patch_given=self.patch_sentence is not None,
            target_given=self.target_token is not None, explicit_input=self.input is not None,
            bug=getattr(self, "inject_bug", None) is not None, decode=getattr(self, "decode", False),
            generate=getattr(self, "generate", None) is not None, lm_head=config.has_lm_head))
        if not ivs:
            return None
        patch = None
        if self.patch_sentence is not None:
            try:
                patch = split_tokens(sentence=self.patch_sentence, tokens=None, max_tokens=max_tokens)
            except EngineError as e:
                e.field = "patch_sentence"
                raise
        IV.check_interventions(ivs, config, len(tokens), patch_n=None if patch is None else len(patch), cross=m is not None)
        if config.has_lm_head:
            IV.check_target_token(self.target_token, LM.vocabulary([t.text for t in tokens],
                                                                   config.candidates))
        return patch

    def engine_interventions(self) -> tuple[IV.Intervention, ...]:
        """The request's interventions as the engine's."""
        return tuple(IV.Intervention(target=i.target, layer=i.layer, kind=i.kind, head=i.head,
                                     positions=None if i.positions is None else tuple(i.positions))
                     for i in self.interventions or ())

    # Read from __pydantic_private__ itself: pydantic's __getattr__ for a private attribute costs ~1.2 µs
    # (it probes the attribute for __get__ through an AttributeError), and a request reads these several times.
    @property
    def trace_config(self) -> TraceConfig:
        """The engine's configuration, built (and checked) by the engine during validation."""
        config = self.__pydantic_private__["_config"]
        assert config is not None, "validate the request first"
        return config

    @property
    def split(self) -> list[Token]:
        """The tokens, split (and checked) once during validation."""
        return self.__pydantic_private__["_tokens"]

    @property
    def context_split(self) -> list[Token] | None:
        """Cross-attention's context tokens, split once during validation (None for self-attention)."""
        return self.__pydantic_private__["_context"]

    @property
    def patch_split(self) -> list[Token] | None:
        """patch_sentence's tokens, split once during validation (None without it)."""
        return self.__pydantic_private__["_patch"]

    @property
    def value_count(self) -> int:
        """How many numbers the trace holds (what max_trace_values bounds), counted once during validation."""
        return self.__pydantic_private__["_value_count"]

    def run_trace(self, bug: str | None = None) -> engine.Trace:
        """The engine's trace of this validated request, with its explicit arrays if given.

        An EngineError that escapes (only an explicit input that overflows float64
        can, after validation) becomes a 422 in the one handler, problems.engine_problem.
        """
        params = None
        if self.parameters is not None:
            p = self.parameters
            params = explicit_parameters(p.W_Q, p.W_K, p.W_V, p.W_O, d_model=self.d_model,
                                         num_heads=self.num_heads, num_kv_heads=self.num_kv_heads)
        t = engine.trace(self.trace_config, split=self.split, input=self.input, parameters=params, bug=bug,
                         context_split=self.context_split, context_input=self.context_input)
        return t if not self.interventions else self.intervened(t)

    def run_traces(self, bug: str | None = None) -> tuple[engine.Trace, engine.Trace | None]:
        """(the trace, intervened when asked; its baseline, or None without interventions)."""
        t = self.run_trace(bug)
        return t, t.baseline

    def intervened(self, baseline: engine.Trace) -> engine.Trace:
        """The baseline with the request's interventions made (engine.interventions.intervene); the patch's
        second input (patch_sentence) is traced clean with the same configuration first."""
        patch = self.patch_split
        source = None if patch is None else engine.trace(self.trace_config, split=patch)
        return IV.intervene(baseline, self.engine_interventions(), source)


@lru_cache(maxsize=1024, typed=True)  # a handful of configurations recur: each checked and built once
def _checked_config(*values: Any, max_tokens: int, cross: bool, input_given: bool, context_input_given: bool,
                    parameters_given: bool, decode: bool, bug: str | None) -> TraceConfig:
    """A request's TraceConfig from its settings' ``values`` (in engine/fields.py's SETTINGS order), its sizes and
    every conflict between its settings checked by the engine (an EngineError: call it under ``engine_rules``),
    the token-independent part of ``TraceSpec._consistent``.

    A function of the settings alone, so it is cached: a configuration that recurs is the very same
    TraceConfig, whose derived values (d_k, the steps, the stage layout) are then computed once. ``typed``
    keeps values of different types apart (true and 1, 1 and 1.0), as the answers echo them."""
    return fields.checked_config(dict(zip(fields.SETTINGS, values)), max_tokens=max_tokens, cross=cross,
                                 input_given=input_given, context_input_given=context_input_given,
                                 parameters_given=parameters_given, decode=decode, bug=bug)


def settings_of(info: ValidationInfo) -> Settings:
    """The limits in force, from the validation context (the defaults without one)."""
    ctx = info.context or {}
    return ctx.get("settings") or Settings()


# ----------------------------------------------------------------- responses


def omitted(description: str, *, nullable: bool = False) -> Any:
    """An output field the service leaves out of an answer where it does not apply: not required, and
    no ``default`` in the schema (generated clients, openapi-typescript's for one, read a default as
    "always present"); null only when ``nullable`` (sent as null in some answers)."""

    def schema(s: dict[str, Any]) -> None:
        s.pop("default", None)
        if not nullable and "anyOf" in s:
            branches = [b for b in s.pop("anyOf") if b != {"type": "null"}]
            if len(branches) == 1:
                s.update(branches[0])
            else:
                s["anyOf"] = branches

    return Field(default=None, description=description, json_schema_extra=schema)


class TokenOut(BaseModel):
    index: int = Field(description="Position in the sequence, from 0.")
    text: str
    start: int = Field(description="Offset of the first character in the sentence (Unicode code points).")
    end: int = Field(description="Offset just past the last character: sentence[start:end] == text.")


class KVCacheBytes(BaseModel):
    float16: int
    float32: int
    float64: int


#: what an answer's config adds to the declared fields' echo, after each variant's own (engine/fields.py's
#: Variant.derived, the request options and sizes), with their schema
_CONFIG_OUT_AFTER: dict[str, dict[str, Any]] = {
    "attention": {
        "include_parameters": (bool, ...),
        "stages": (list[StageId] | None, Field(description="The stages asked for; null means all.")),
        "precision": (int | None, Field(description="Decimal places numbers were rounded to; null means exact.")),
        "d_k": (int, Field(description="d_model / num_heads.")),
        "scale_factor": (float, Field(description="√d_k when scale is on, else 1.")),
        "n_tokens": (int, ...),
        "n_parameters": (int, Field(description="Every weight of the trace, as many numbers as include_parameters "
                                                "returns. One layer: W_Q, W_K, W_V and W_O, 4·d_model² (2·d_model² + "
                                                "2·g·d_k·d_model with g = num_kv_heads shared K/V heads). A stack of "
                                                "blocks: every layer's attention, its FFN's 2·d_ff·d_model (SwiGLU "
                                                "3·d_ff·d_model) and both norms' γ and β (RMSNorm: γ), unit ones too, "
                                                "plus the final norm's in pre-norm: num_layers·(attention + FFN + "
                                                "2·norm) + final norm, norm = 2·d_model (LayerNorm) or d_model "
                                                "(RMSNorm). gpt2, d_model 8, 2 heads, 1 layer: 816.")),
        "n_matrices": (int, Field(description="One layer: 3·num_heads + 1 (num_heads + 2·g + 1 with g shared K/V "
                                              "heads). A stack of blocks: num_layers·(num_heads + 2·g + 1 + 2, or 3 "
                                              "with SwiGLU): every layer's attention and FFN matrices; the norms' "
                                              "vectors are not matrices. gpt2, 2 heads, 2 layers: 18.")),
    },
    "gqa": {
        "query_heads_of_kv_head": (list[list[int]] | None, omitted(
            "Only with num_kv_heads: for each K/V head, the query heads that share it.")),
        "kv_cache_bytes_per_token": (KVCacheBytes | None, omitted(
            "Only with num_kv_heads: a KV cache's bytes per token for this layer, 2·num_kv_heads·d_k numbers at "
            "each float width.")),
    },
    "cross": {
        "n_context_tokens": (int | None, omitted("Cross-attention only.")),
        "decode": (bool | None, omitted("Only when decode was asked for (then true).")),
        "parameters_layout": (Literal["torch"] | None, omitted("Only when not per_head.")),
    },
    "lm": {
        "n_vocabulary": (int | None, omitted("Only with lm_head: how many tokens the vocabulary holds.")),
        "generate": (int | None, omitted("Only with generate: how many tokens were generated.")),
        "top_k": (int | None, omitted("Only with generate and top_k.")),
        "top_p": (float | None, omitted("Only with generate and top_p.")),
        "sample_seed": (int | None, omitted("Only with generate: the sampling seed, null for greedy.", nullable=True)),
    },
}


def _echo_field(f: fields.Field) -> tuple[Any, Any]:
    """A declared field in an answer's config: always there (the attention's own), or only where its variant is
    used (the variants' settings appear only then, so engine 1.0 answers keep their shape)."""
    doc = f.echo_description()
    if doc is None:
        return _annotation(f), ...
    return _annotation(f, echo=True), omitted(doc, nullable=f.echo_nullable)


#: an answer's config: the declared fields' echo (engine/fields.py, config_echo), variant by variant
if TYPE_CHECKING:  # a model built at import time is no type to mypy: its fields are checked by the tests
    class ConfigOut(BaseModel):
        pass
else:
    ConfigOut = create_model(
        "ConfigOut", **{name: spec for v in fields.VARIANTS for name, spec in (
            *((f.name, _echo_field(f)) for f in fields.of_variant(v.name) if f.echoed),
            *_CONFIG_OUT_AFTER.get(v.name, {}).items())})


class InjectedBug(BaseModel):
    name: AnyBugName
    summary: str
    warning: str = Field(description="Always says that these numbers are deliberately wrong.")


class ValidationErrorItem(BaseModel):
    pointer: str = Field(description="JSON pointer (RFC 6901) to the offending field; empty for the whole body.")
    message: str
    type: str = Field(description="Machine-readable error type.")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str = Field(description="The request's path.")
    errors: list[ValidationErrorItem] | None = omitted("422 only: every problem with the request.")
