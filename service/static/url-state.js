/*
 * attention-trace viewer: the inputs as data. Pure: no DOM, no state.
 *
 * `fields` are the form's values as the controls hold them (text as typed, switches as booleans), keyed by the
 * request's field names. From them: the /trace request they describe (and what JSON cannot carry), the counts the
 * d_k card shows before the service answers, the request as a curl command; and the view in the address,
 * both ways: `#sentence=the+cat+sat&d_model=24&num_heads=4&q=1&head=2&causal=1` (heads and tokens from 0, as in
 * the API). A value the address cannot hold (not a whole number, an unknown option) falls back to the default.
 * A stack of Transformer blocks adds `block` (a preset) and `layers` (num_layers) to the request's part, and the
 * shown layer (`layer`, from 0) and block stage (`bstage`) to the selection; a plain request leaves all four out.
 * Constructed heads (docs/engine.md, "Constructed heads") add `hw` (head_weights, one kind a head, comma-separated)
 * and `sharpness` (when not 10); a request whose heads are all seeded sends neither field.
 *
 * Every field's type, bounds, default, variant and address key come from engine/fields.py's declaration (fields.js,
 * generated): a field the page has no control of its own for still travels between the address, the form and the
 * request, by its kind, with no code here that names it.
 *
 * Adds `urlState` to globalThis.AttentionTrace (after format.js and fields.js); tests/js/url-state.test.js runs it
 * under Node.
 */
'use strict';

(() => {
  const { fmt, int, fmtBase, shellQuote, SCALE_MODES } = globalThis.AttentionTrace.format;

  /**
   * engine/fields.py's declaration (fields.js): each field the address carries, with its kind, bounds, default,
   * variant and address key. Every rule below reads it; none holds a copy of a field's type, bounds or default.
   */
  const DECLARED = globalThis.AttentionTrace.fields;
  const FIELDS = DECLARED.fields;
  const FIELD = Object.freeze(Object.fromEntries(FIELDS.map((f) => [f.name, f])));

  /** The page's own default sentence, and every declared default that is not null. */
  const DEFAULTS = Object.freeze({
    sentence: 'the cat sat',
    ...Object.fromEntries(FIELDS.filter((f) => f.default !== null).map((f) => [f.name, f.default])),
  });

  /** The form's text for a declared default: a switch's boolean, a number or choice as typed, '' for none. */
  const formDefault = (f) => (f.kind === 'bool' ? f.default : f.default === null ? '' : String(f.default));

  /** The head kinds the service builds (engine/constructed.py, HEAD_KINDS); 'seeded' is every head's default. */
  const HEAD_KINDS = Object.freeze([...FIELD.head_weights.choices]);
  const SEEDED = HEAD_KINDS[0];

  /** The form as the page first shows it (index.html's values): every declared field's default, and decoding off. */
  const DEFAULT_FIELDS = Object.freeze({
    ...Object.fromEntries(FIELDS.map((f) => [f.name, formDefault(f)])), sentence: DEFAULTS.sentence, decode: false,
  });

  /** The block presets the page offers ('' is attention alone, no block), in the order the control lists them. */
  const BLOCKS = Object.freeze([...FIELD.block.choices]);

  /**
   * What a preset sets outside the block (engine/layer.py's BlockPreset: positional_encoding and causal). The
   * service applies them only to fields a request leaves out, and the page always sends both; so choosing a preset
   * sets the two controls to the preset's values, and the lecturer may change them afterwards.
   */
  const PRESET_FIELDS = Object.freeze(Object.fromEntries(Object.entries(DECLARED.block_presets)
    .map(([name, set]) => [name, Object.freeze({ ...set })])));

  /** The fields with a preset's own choices applied (choosing it in the control); '' (no block) changes nothing. */
  const withPreset = (fields, block) => (PRESET_FIELDS[block] ? { ...fields, block, ...PRESET_FIELDS[block] } : { ...fields, block });

  /** A whole number 0 or more as typed (spaces around it allowed), or null. */
  function readInt(text) {
    const raw = String(text).trim();
    if (!/^\d+$/.test(raw)) return null;
    const n = Number(raw);
    return Number.isSafeInteger(n) ? n : null;
  }

  /**
   * The heads' kinds as the fields hold them (`head_weights`: kinds joined by commas, '' when every head is seeded),
   * as a list of `n` (padded with seeded heads, cut to n): the page shows one choice a head.
   */
  function headKinds(text, n) {
    const given = String(text ?? '').split(',').map((k) => k.trim()).filter((k) => k !== '');
    return Array.from({ length: Math.max(n, 0) }, (_, i) => given[i] ?? SEEDED);
  }

  /** A list of choices as the fields hold it: joined by commas, '' when every item is the first choice (the default). */
  const listText = (f, items) => (items.every((k) => k === f.choices[0]) ? '' : items.join(','));

  /** The fields' text for a list of kinds: '' when every head is seeded (the request then leaves them out). */
  const kindsText = (kinds) => listText(FIELD.head_weights, kinds);

  /** Pre-split tokens, one a line (a final line break is not an empty token). */
  const splitLines = (text) => text.replace(/\n+$/, '').split('\n');

  /** What to type instead of a number the field cannot hold, from its declared bounds. */
  const numberHint = (f) => (f.kind === 'int'
    ? `enter a whole number, ${f.minimum ?? 0} or more${f.default === null ? ' (or leave it empty)' : ''}`
    : `enter a number ${f.above !== undefined ? `above ${f.above}` : `from ${f.minimum ?? 0}`}`
      + `${f.maximum !== undefined ? `, at most ${f.maximum}` : ''}`);

  /** A declared field's value as the request sends it, from its text in the form ({pointer: message} for a number
   * that is none: sent as null). */
  function valueOf(f, text, errors) {
    switch (f.kind) {
      case 'int': case 'float': {
        const raw = String(text).trim();
        const n = f.kind === 'int' ? readInt(raw) : raw === '' ? NaN : Number(raw);
        if (n === null || !Number.isFinite(n)) {
          errors[`/${f.name}`] = numberHint(f);
          return null;
        }
        return n;
      }
      case 'choices': return String(text).split(',').map((k) => k.trim());
      case 'tokens': return splitLines(text);
      case 'strings': return String(text).trim().split(/\s+/); // words, one space apart in a one-line control
      default: return text; // a switch's boolean, a choice, a text as typed
    }
  }

  /** Whether the form gives a field a value of its own: not its default (empty, for a field without one). */
  function given(f, text) {
    if (f.kind === 'bool') return text !== f.default;
    const raw = f.kind === 'text' || f.kind === 'tokens' ? String(text ?? '') : String(text ?? '').trim();
    return f.default === null ? raw !== '' : raw !== String(f.default);
  }

  /** Whether a variant with a switch (fields.js `switches`) is on: its field has the value (null: is given). */
  function switchedOn(variant, fields) {
    const [name, value] = DECLARED.switches[variant];
    return value === null ? given(FIELD[name], fields[name] ?? formDefault(FIELD[name])) : fields[name] === value;
  }

  /**
   * The /trace request the fields describe, and {pointer: message} for what JSON cannot carry (those fields are
   * sent as null), in the declaration's order. The attention's own fields are always sent; a variant with a switch
   * (RoPE: the positional encoding; constructed heads: a head that is not seeded) sends all its fields when on,
   * an empty one as its default (explicit, so the curl says it); any other field is sent when given, so a plain
   * request stays plain.
   */
  function requestFrom(fields) {
    const errors = {};
    const body = {};
    for (const f of FIELDS) {
      const text = fields[f.name] ?? formDefault(f);
      if (f.variant === 'attention') body[f.name] = valueOf(f, text, errors);
      else if (f.variant in DECLARED.switches) {
        if (switchedOn(f.variant, fields)) body[f.name] = valueOf(f, String(text).trim() === '' ? formDefault(f) : text, errors);
      } else if (given(f, text)) body[f.name] = valueOf(f, text, errors);
    }
    if (fields.decode) body.decode = true;
    return { body, errors };
  }

  /** A declared field's text in the form, from a value a request sent or an answer echoes. */
  function formText(f, value) {
    if (f.kind === 'bool' || f.kind === 'text' || f.kind === 'choice') return value;
    if (f.kind === 'choices') return listText(f, value);
    if (f.kind === 'tokens') return value.join('\n');
    if (f.kind === 'strings') return value.join(' ');
    return fmtBase(value);
  }

  /**
   * The fields a trace was made with (a saved page shows them, disabled): each as its request sent it, else (a
   * setting) as its config echoes it, else its default; the sentence's text, or its tokens joined.
   */
  function fieldsFromTrace(request, doc) {
    const cfg = doc.config;
    const out = { ...DEFAULT_FIELDS };
    for (const f of FIELDS) {
      const sent = request[f.name] ?? (f.setting ? cfg[f.name] : undefined);
      if (sent !== undefined && sent !== null) out[f.name] = formText(f, sent);
    }
    if (typeof request.sentence !== 'string') out.sentence = doc.tokens.map((t) => t.text).join(' ');
    out.decode = cfg.decode === true;
    return out;
  }

  /**
   * The comparison request: the same with scale flipped (and without decoding: it needs the weights only). A request
   * without `scale` is scaled (the service's default), so its comparison is not (service/offline_page.py alike).
   */
  function comparisonBody(body) {
    const alt = { ...body, scale: 'scale' in body ? !body.scale : false };
    delete alt.decode;
    return alt;
  }

  /** The head counts that divide d_model, up to the service's limit: the slider's ticks. */
  function divisors(n, maxHeads) {
    const out = [];
    for (let i = 1; i <= Math.min(n, maxHeads); i += 1) if (n % i === 0) out.push(i);
    return out;
  }

  /**
   * The d_k card from the fields as typed, before the service answers: every number describes that one
   * configuration, and a count it does not have is "—". `sliderMax`: the head slider spans 1 … d_model (never
   * below the current value, so typing never clamps it); null while d_model is not a number.
   */
  function dkCard(fields, maxHeads) {
    const dModel = readInt(fields.d_model);
    const heads = readInt(fields.num_heads);
    const gqa = fields.num_kv_heads.trim() !== '';
    const kv = gqa ? readInt(fields.num_kv_heads) : null;
    const dk = dModel !== null && heads ? dModel / heads : null;
    const whole = dk !== null && Number.isInteger(dk);
    const kvOk = !gqa || (kv !== null && kv >= 1 && heads !== null && heads % kv === 0);
    return {
      dModel, heads, gqa, dk, whole,
      shown: {
        dModel: dModel === null ? '?' : String(dModel),
        heads: String(heads ?? '?'),
        dk: dk === null ? '?' : whole ? String(dk) : String(Number(dk.toFixed(3))),
        // GQA: W_Q and W_O stay d_model × d_model; W_K and W_V shrink to kv·d_k rows each.
        matrices: heads && kvOk ? String(gqa ? heads + 2 * kv + 1 : 3 * heads + 1) : '—',
        params: dModel === null || !kvOk || (gqa && !whole) ? '—'
          : int(gqa ? 2 * dModel * dModel + 2 * kv * dk * dModel : 4 * dModel * dModel),
        scale: !fields.scale ? fmt(1, 4) : whole ? fmt(Math.sqrt(dk), 4) : '—',
      },
      sliderMax: dModel === null ? null : Math.min(maxHeads, Math.max(dModel, heads || 1, 2)),
    };
  }

  /**
   * Where a service message about `pointer` goes: {field, text} with `field` one of `known` (the pointer itself,
   * or the list it is an item of: /context_tokens/1 is line 2 of the context tokens), or null.
   */
  function fieldError(pointer, message, known) {
    const field = known.includes(pointer) ? pointer : `/${pointer.split('/')[1] || ''}`;
    if (!known.includes(field)) return null;
    const rest = pointer.slice(field.length + 1);
    const text = field === pointer ? message
      : field === '/context_tokens' && /^\d+$/.test(rest) ? `line ${Number(rest) + 1} (token ${rest}): ${message}`
        : field === '/head_weights' && /^\d+$/.test(rest) && !message.startsWith(`head ${rest} `) ? `head ${rest}: ${message}`
          : field === '/head_weights' && /^\d+$/.test(rest) ? message : `${rest}: ${message}`;
    return { field, text };
  }

  /**
   * The service's words for a field, in the page's: a message names the request's fields (`causal: true`, `drop
   * window`, `num_heads 5`), the page shows the controls that set them ("the causal mask on", "clear Sliding
   * window", "h = 5"). Only these phrasings change; the rest of the message, numbers included, is the service's.
   */
  const UI_WORDS = Object.freeze([
    // Constructed heads: head_weights[1] (same_token) is the page's "head 1 (same-token)", the kinds as it lists them.
    [/\bhead_weights\[(\d+)\] \(([a-z_]+)\)/g, (all, i, kind) => `head ${i} (${kind.replace(/_/g, '-')})`],
    [/\bhead_weights\[(\d+)\]/g, 'head $1'],
    [/\bhead_weights\b/g, 'Head weights'],
    [/\bsharpness\b/g, 'Sharpness'],
    [/\bdrop num_kv_heads\b/g, 'clear K/V heads'],
    [/\bmake every head "seeded"/g, 'make every head seeded'],
    [/\bset causal: true\b/g, 'switch the causal mask on'],
    [/\bset causal: false\b/g, 'switch the causal mask off'],
    [/\bcausal: true\b/g, 'the causal mask'],
    [/\bcausal: false\b/g, 'the causal mask off'],
    [/\bdrop window\b/g, 'clear Sliding window'],
    [/\bdrop decode\b/g, 'switch KV-cache decoding off'],
    [/\bdrop the context\b/g, 'clear the context sentence and tokens'],
    [/\buse positional_encoding "([a-z]+)"( or "([a-z]+)")?/g,
      (all, a, or, b) => `choose the positional encoding ${a}${or ? ` or ${b}` : ''}`],
    [/\bpositional_encoding "([a-z]+)"/g, 'the positional encoding $1'],
    [/\bpositional_encoding\b/g, 'the positional encoding'],
    [/\bnum_kv_heads\b/g, 'K/V heads'],
    [/\bnum_heads (\d+)/g, 'h = $1'],
    [/\bnum_heads\b/g, 'h'],
    [/\bcontext_sentence\b/g, 'Context sentence'],
    [/\bcontext_tokens\b(?!\[)/g, 'Context tokens'], // context_tokens[0]: the line is named already
    [/\brope_base\b/g, 'RoPE base'],
    [/\brope_pairing\b/g, 'RoPE pairing'],
    [/\bor null\b/g, 'or empty'],
    [/\bdrop num_layers\b/g, 'set Layers to 1'],
    [/\bnum_layers\b/g, 'Layers'],
    [/\bgive block \(/g, 'choose a Block ('],
    [/\bor (drop )?the block fields\b/g, 'or choose Block: none'],
  ]);

  function uiWords(message) {
    return UI_WORDS.reduce((text, [pattern, words]) => text.replace(pattern, words), String(message));
  }

  /** The request as a curl command: to this page's service, or, from a saved page, to $ATTENTION_TRACE_URL. */
  function curlFor(body, { saved = false, href = '' } = {}) {
    // A saved page does not know where the service runs: the shell fills it in.
    const url = saved ? '"$ATTENTION_TRACE_URL/trace"' : shellQuote(new URL('trace', href).href);
    return `curl -s ${url} -H 'content-type: application/json' -d ${shellQuote(JSON.stringify(body))}`;
  }

  // ---------------------------------------------------------------- the address

  function params(hash) {
    return new URLSearchParams(hash.startsWith('#') ? hash.slice(1) : hash);
  }

  /**
   * The address's fragment for the view: the fields (null on a saved page, whose inputs are fixed: the selection
   * only) and the selection {query, head, step} (step null: not in the address).
   */
  function hashFor(fields, selection) {
    const p = new URLSearchParams();
    if (fields !== null) {
      // Each field the request sends, under its address key: a switch as 1 or 0, the attention's numbers always,
      // a choice or any other number (as typed) only when not its default.
      const { body } = requestFrom(fields);
      for (const f of FIELDS) {
        if (!(f.name in body)) continue;
        const value = body[f.name];
        const text = String(fields[f.name] ?? '').trim();
        if (f.kind === 'bool') p.set(f.url, value ? '1' : '0');
        else if (f.kind === 'tokens' || f.kind === 'strings') for (const t of value) p.append(f.url, t);
        else if (f.kind === 'choices') p.set(f.url, value.join(','));
        else if (f.kind === 'text') p.set(f.url, value);
        else if (f.kind === 'choice') { if (value !== f.default) p.set(f.url, value); } else if (f.variant === 'attention') {
          if (value !== null) p.set(f.url, String(value));
        } else if (text !== '' && text !== formDefault(f)) p.set(f.url, text);
      }
      if (body.decode) p.set('decode', '1');
    }
    if (selection.step !== null && selection.step !== undefined) p.set('step', String(selection.step));
    // A stack's shown layer (0-based) and block stage; neither for one attention layer.
    if (selection.layer !== null && selection.layer !== undefined) p.set('layer', String(selection.layer));
    if (selection.bstage) p.set('bstage', selection.bstage);
    p.set('q', String(selection.query));
    p.set('head', String(selection.head)); // 0-based, as in the API
    // The view's own settings, each only when it is not the default (a plain address stays plain).
    if (selection.colour && selection.colour !== 'auto') p.set('colour', selection.colour);
    if (selection.present) p.set('present', '1');
    if (selection.present && selection.slide) p.set('slide', selection.slide);
    // a busy slide's figure, shown one a step (1-based in the address; the first is not written)
    if (selection.present && selection.slide && Number.isInteger(selection.part) && selection.part > 0) {
      p.set('part', String(selection.part + 1));
    }
    // ---- the view's own settings for a lecture hall (text scale), each only when not the default
    if (selection.text && selection.text !== 1) p.set('text', String(Math.round(selection.text * 100)));
    if (THEMES.includes(selection.theme) && selection.theme !== 'system') p.set('theme', selection.theme);
    // the clicked cell: its key (its query and head are q and head), so that a shared link explains it again
    if (Number.isInteger(selection.key) && selection.key >= 0) p.set('key', String(selection.key));
    // the ablation (a head's output, a layer's MLP output zeroed): a shared link asks for the same intervened trace
    if (selection.ablate) p.set('ablate', `${selection.ablate.layer}.${selection.ablate.head}`);
    if (Number.isInteger(selection.ablateMlp) && selection.ablateMlp >= 0) p.set('ablate_mlp', String(selection.ablateMlp));
    return `#${p.toString()}`;
  }

  /** The most items a list in the address may hold (one head kind a head: the service allows 512 heads). */
  const MAX_LIST = 512;

  /** A declared field's text from the address's value, or null when the address cannot hold it. */
  function fromAddress(f, raw) {
    switch (f.kind) {
      case 'bool': return f.default ? raw !== '0' : raw === '1';
      case 'int': return /^\d{1,10}$/.test(raw) ? raw : null;
      case 'float': return /^[0-9.eE+-]{1,24}$/.test(raw) ? raw : null;
      case 'choice': return f.choices.includes(raw) ? raw : null;
      case 'choices': {
        const items = raw.split(',');
        return items.length <= MAX_LIST && items.every((k) => f.choices.includes(k)) ? listText(f, items) : '';
      }
      default: return raw; // a text as given
    }
  }

  /** The fields an address describes; what it leaves out, or cannot hold, is the default. */
  function fieldsFromHash(hash) {
    const p = params(hash);
    const out = { ...DEFAULT_FIELDS };
    for (const f of FIELDS) {
      if (!p.has(f.url)) continue;
      const text = f.kind === 'tokens' ? p.getAll(f.url).join('\n')
        : f.kind === 'strings' ? p.getAll(f.url).join(' ') : fromAddress(f, p.get(f.url));
      if (text !== null) out[f.name] = text;
    }
    out.decode = p.get('decode') === '1';
    return out;
  }

  /**
   * The view an address selects: the query token, head and decoding step (step null: the first one), the maps'
   * colour scale (format.js's SCALE_MODES), and present mode with its slide (an id of trace.js's presentSlides;
   * null: the first), and a stack's layer (null: the first) and block stage (an id of block.js's diagram; null: the
   * first), the slide's figure (`part`, 0-based, when a busy slide is shown one figure a step), the clicked cell's key,
   * and the ablation (`ablate`: {layer, head}; `ablateMlp`: a layer), each only when set.
   */
  function selectionFromHash(hash) {
    const p = params(hash);
    const get = (k, d) => (p.has(k) ? p.get(k) : d);
    const step = Number(get('step', 'x'));
    const q = Number(get('q', '1'));
    const head = Number(get('head', '0'));
    const colour = get('colour', 'auto');
    const slide = get('slide', '');
    const part = get('part', '');
    const layer = get('layer', 'x');
    const bstage = get('bstage', '');
    return {
      step: Number.isInteger(step) && step >= 0 ? step : null,
      query: Number.isInteger(q) && q >= 0 ? q : 1,
      head: Number.isInteger(head) && head >= 0 ? head : 0,
      colour: SCALE_MODES.includes(colour) ? colour : 'auto',
      present: get('present', '0') === '1',
      slide: /^[a-z_-]{1,32}$/.test(slide) ? slide : null,
      layer: /^\d{1,3}$/.test(layer) ? Number(layer) : null,
      bstage: /^[a-z_0-9]{1,32}$/.test(bstage) ? bstage : null,
      // ---- the view's own settings for a lecture hall, only when the address sets them (a reader takes the
      // default otherwise): the text scale, a percentage of TEXT_SCALES
      ...(TEXT_SCALES.includes(Number(get('text', '100')) / 100) && get('text', '100') !== '100'
        ? { text: Number(get('text', '100')) / 100 } : {}),
      ...(/^\d{1,4}$/.test(get('key', '')) ? { key: Number(get('key', '')) } : {}),
      // a busy slide's figure (present mode shows it one figure a step): 1-based in the address, 0-based here
      ...(/^\d{1,2}$/.test(part) && Number(part) >= 1 ? { part: Number(part) - 1 } : {}),
      // the ablated head (`layer.head`, both 0-based) and MLP (its layer), only when the address names them
      ...(/^\d{1,3}\.\d{1,3}$/.test(get('ablate', ''))
        ? { ablate: { layer: Number(get('ablate', '').split('.')[0]), head: Number(get('ablate', '').split('.')[1]) } } : {}),
      ...(/^\d{1,3}$/.test(get('ablate_mlp', '')) ? { ablateMlp: Number(get('ablate_mlp', '')) } : {}),
      ...(THEMES.includes(get('theme', '')) && get('theme', '') !== 'system' ? { theme: get('theme', '') } : {}),
    };
  }

  /** The projector text scales the page offers (× the text size; present mode's 125% on top). */
  const TEXT_SCALES = Object.freeze([1, 1.25, 1.5, 2]);
  /** The colour themes: the system's preference (light or dark, more contrast), or one chosen (style.css). */
  const THEMES = Object.freeze(['system', 'light', 'dark', 'contrast']);

  globalThis.AttentionTrace.urlState = Object.freeze({
    FIELDS, FIELD, DEFAULTS, DEFAULT_FIELDS, BLOCKS, HEAD_KINDS, headKinds, kindsText, PRESET_FIELDS, withPreset, readInt, splitLines, requestFrom, fieldsFromTrace, comparisonBody, divisors, dkCard, fieldError, curlFor,
    hashFor, fieldsFromHash, selectionFromHash, UI_WORDS, uiWords, TEXT_SCALES, THEMES,
  });
})();
