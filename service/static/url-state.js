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
 * Adds `urlState` to globalThis.AttentionTrace (after format.js); tests/js/url-state.test.js runs it under Node.
 */
'use strict';

(() => {
  const { fmt, int, fmtBase, shellQuote, SCALE_MODES } = globalThis.AttentionTrace.format;

  const DEFAULTS = Object.freeze({
    sentence: 'the cat sat', d_model: 24, num_heads: 1, seed: 0, scale: true, causal: false,
    positional_encoding: 'sinusoidal', rope_base: 10000, rope_pairing: 'rotate_half', sharpness: 10,
  });

  /** The head kinds the service builds (engine/constructed.py, HEAD_KINDS); 'seeded' is every head's default. */
  const HEAD_KINDS = Object.freeze(['seeded', 'previous_token', 'same_token', 'first_token', 'induction']);
  const SEEDED = 'seeded';

  /** The form as the page first shows it (index.html's values). */
  const DEFAULT_FIELDS = Object.freeze({
    sentence: DEFAULTS.sentence, d_model: String(DEFAULTS.d_model), num_heads: String(DEFAULTS.num_heads),
    seed: String(DEFAULTS.seed), scale: true, causal: false, positional_encoding: 'sinusoidal',
    rope_base: String(DEFAULTS.rope_base), rope_pairing: DEFAULTS.rope_pairing, num_kv_heads: '', window: '',
    context_sentence: '', context_tokens: '', decode: false, block: '', num_layers: '1',
    head_weights: '', sharpness: String(DEFAULTS.sharpness),
  });

  /** The block presets the page offers ('' is attention alone, no block), in the order the control lists them. */
  const BLOCKS = Object.freeze(['vaswani2017', 'gpt2', 'llama']);

  /**
   * What a preset sets outside the block (engine/layer.py's BlockPreset: positional_encoding and causal). The
   * service applies them only to fields a request leaves out, and the page always sends both; so choosing a preset
   * sets the two controls to the preset's values, and the lecturer may change them afterwards (tests/test_viewer_js.py
   * compares this table with the engine's).
   */
  const PRESET_FIELDS = Object.freeze({
    vaswani2017: Object.freeze({ positional_encoding: 'sinusoidal', causal: false }),
    gpt2: Object.freeze({ positional_encoding: 'sinusoidal', causal: true }),
    llama: Object.freeze({ positional_encoding: 'rope', causal: true }),
  });

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

  /** The fields' text for a list of kinds: '' when every head is seeded (the request then leaves them out). */
  const kindsText = (kinds) => (kinds.every((k) => k === SEEDED) ? '' : kinds.join(','));

  /** Pre-split tokens, one a line (a final line break is not an empty token). */
  const splitLines = (text) => text.replace(/\n+$/, '').split('\n');

  /**
   * The /trace request the fields describe, and {pointer: message} for what JSON cannot carry (those fields are
   * sent as null). The variants' fields are sent only when used, so a plain request stays plain.
   */
  function requestFrom(fields) {
    const errors = {};
    const dModel = readInt(fields.d_model);
    const seed = readInt(fields.seed);
    const heads = readInt(fields.num_heads);
    if (dModel === null) errors['/d_model'] = 'enter a whole number, 1 or more';
    if (seed === null) errors['/seed'] = 'enter a whole number, 0 or more';
    const body = {
      sentence: fields.sentence,
      d_model: dModel,
      num_heads: heads,
      seed,
      scale: fields.scale,
      causal: fields.causal,
      positional_encoding: fields.positional_encoding,
    };
    if (body.positional_encoding === 'rope') {
      const raw = fields.rope_base.trim();
      const base = raw === '' ? DEFAULTS.rope_base : Number(raw);
      if (!Number.isFinite(base)) errors['/rope_base'] = 'enter a number greater than 1';
      body.rope_base = Number.isFinite(base) ? base : null;
      body.rope_pairing = fields.rope_pairing;
    }
    if (fields.num_kv_heads.trim() !== '') {
      body.num_kv_heads = readInt(fields.num_kv_heads);
      if (body.num_kv_heads === null) errors['/num_kv_heads'] = 'enter a whole number, 1 or more (or leave it empty)';
    }
    if (fields.window.trim() !== '') {
      body.window = readInt(fields.window);
      if (body.window === null) errors['/window'] = 'enter a whole number, 1 or more (or leave it empty)';
    }
    if (fields.context_sentence !== '') body.context_sentence = fields.context_sentence;
    if (fields.context_tokens !== '') body.context_tokens = splitLines(fields.context_tokens);
    if (fields.decode) body.decode = true;
    // The stack: a preset, and the layers when not one (more than one without a block is the service's 422 to say).
    const block = fields.block ?? '';
    if (block !== '') body.block = block;
    const layersText = String(fields.num_layers ?? '1').trim();
    if (layersText !== '1') {
      body.num_layers = readInt(layersText);
      if (body.num_layers === null) errors['/num_layers'] = 'enter a whole number, 1 or more';
    }
    // Constructed heads: sent only when a head is not seeded, with the sharpness (explicit, so the curl says it).
    const kinds = String(fields.head_weights ?? '').trim();
    if (kinds !== '') {
      body.head_weights = kinds.split(',').map((k) => k.trim());
      const raw = String(fields.sharpness ?? '').trim();
      const sharpness = raw === '' ? DEFAULTS.sharpness : Number(raw);
      if (!Number.isFinite(sharpness)) errors['/sharpness'] = 'enter a number above 0, at most 1000';
      body.sharpness = Number.isFinite(sharpness) ? sharpness : null;
    }
    return { body, errors };
  }

  /** The fields a trace was made with (a saved page shows them, disabled): its config, and its request's text. */
  function fieldsFromTrace(request, doc) {
    const cfg = doc.config;
    return {
      sentence: typeof request.sentence === 'string' ? request.sentence : doc.tokens.map((t) => t.text).join(' '),
      d_model: String(cfg.d_model),
      num_heads: String(cfg.num_heads),
      seed: String(cfg.seed),
      scale: cfg.scale,
      causal: cfg.causal,
      positional_encoding: cfg.positional_encoding,
      rope_base: cfg.rope_base !== undefined ? fmtBase(cfg.rope_base) : DEFAULT_FIELDS.rope_base,
      rope_pairing: cfg.rope_pairing !== undefined ? cfg.rope_pairing : DEFAULT_FIELDS.rope_pairing,
      num_kv_heads: cfg.num_kv_heads !== undefined ? String(cfg.num_kv_heads) : '',
      window: cfg.window !== undefined ? String(cfg.window) : '',
      context_sentence: typeof request.context_sentence === 'string' ? request.context_sentence : '',
      context_tokens: Array.isArray(request.context_tokens) ? request.context_tokens.join('\n') : '',
      decode: cfg.decode === true,
      block: typeof request.block === 'string' ? request.block : typeof cfg.block === 'string' ? cfg.block : '',
      num_layers: String(request.num_layers ?? cfg.num_layers ?? 1),
      head_weights: Array.isArray(cfg.head_weights) ? kindsText(cfg.head_weights) : '',
      sharpness: cfg.sharpness !== undefined ? String(cfg.sharpness) : DEFAULT_FIELDS.sharpness,
    };
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
      const { body } = requestFrom(fields);
      p.set('sentence', body.sentence);
      for (const k of ['d_model', 'num_heads', 'seed']) if (body[k] !== null) p.set(k, String(body[k]));
      p.set('scale', body.scale ? '1' : '0');
      p.set('causal', body.causal ? '1' : '0');
      if (body.positional_encoding !== 'sinusoidal') p.set('pe', body.positional_encoding);
      if (body.positional_encoding === 'rope') {
        if (fields.rope_base.trim() !== String(DEFAULTS.rope_base)) p.set('rope_base', fields.rope_base.trim());
        if (body.rope_pairing !== DEFAULTS.rope_pairing) p.set('rope_pairing', body.rope_pairing);
      }
      if (fields.num_kv_heads.trim() !== '') p.set('kv', fields.num_kv_heads.trim());
      if (fields.window.trim() !== '') p.set('window', fields.window.trim());
      if ('context_sentence' in body) p.set('context', body.context_sentence);
      for (const t of body.context_tokens || []) p.append('ctok', t);
      if (body.decode) p.set('decode', '1');
      if (body.block) p.set('block', body.block);
      if (String(fields.num_layers ?? '1').trim() !== '1') p.set('layers', String(fields.num_layers).trim());
      if (body.head_weights) p.set('hw', body.head_weights.join(','));
      const sharpness = String(fields.sharpness ?? '').trim();
      if (body.head_weights && sharpness !== '' && sharpness !== String(DEFAULTS.sharpness)) p.set('sharpness', sharpness);
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
    // ---- the view's own settings for a lecture hall (text scale), each only when not the default
    if (selection.text && selection.text !== 1) p.set('text', String(Math.round(selection.text * 100)));
    if (THEMES.includes(selection.theme) && selection.theme !== 'system') p.set('theme', selection.theme);
    // the clicked cell: its key (its query and head are q and head), so that a shared link explains it again
    if (Number.isInteger(selection.key) && selection.key >= 0) p.set('key', String(selection.key));
    return `#${p.toString()}`;
  }

  /** The fields an address describes; what it leaves out, or cannot hold, is the default. */
  function fieldsFromHash(hash) {
    const p = params(hash);
    const get = (k, d) => (p.has(k) ? p.get(k) : d);
    const whole = (k, d) => (/^\d{1,10}$/.test(get(k, '')) ? get(k, '') : String(d));
    const optional = (k) => (/^\d{1,10}$/.test(get(k, '')) ? get(k, '') : '');
    const pe = get('pe', 'sinusoidal');
    const base = get('rope_base', String(DEFAULTS.rope_base));
    // Head kinds: known ones only, at most one a head the service allows; anything else is every head seeded.
    const hw = get('hw', '').split(',');
    const kinds = hw.length <= 512 && hw.every((k) => HEAD_KINDS.includes(k)) ? kindsText(hw) : '';
    const sharpness = get('sharpness', String(DEFAULTS.sharpness));
    return {
      sentence: get('sentence', DEFAULTS.sentence),
      d_model: whole('d_model', DEFAULTS.d_model),
      num_heads: whole('num_heads', DEFAULTS.num_heads),
      seed: whole('seed', DEFAULTS.seed),
      scale: get('scale', '1') !== '0',
      causal: get('causal', '0') === '1',
      positional_encoding: ['none', 'rope'].includes(pe) ? pe : 'sinusoidal',
      rope_base: /^[0-9.eE+]{1,24}$/.test(base) ? base : String(DEFAULTS.rope_base),
      rope_pairing: get('rope_pairing', DEFAULTS.rope_pairing) === 'interleaved' ? 'interleaved' : 'rotate_half',
      num_kv_heads: optional('kv'),
      window: optional('window'),
      context_sentence: get('context', ''),
      context_tokens: p.getAll('ctok').join('\n'),
      decode: get('decode', '0') === '1',
      block: BLOCKS.includes(get('block', '')) ? get('block', '') : '',
      num_layers: whole('layers', 1),
      head_weights: kinds,
      sharpness: /^[0-9.eE+-]{1,24}$/.test(sharpness) ? sharpness : String(DEFAULTS.sharpness),
    };
  }

  /**
   * The view an address selects: the query token, head and decoding step (step null: the first one), the maps'
   * colour scale (format.js's SCALE_MODES), and present mode with its slide (an id of trace.js's presentSlides;
   * null: the first), and a stack's layer (null: the first) and block stage (an id of block.js's diagram; null: the
   * first).
   */
  function selectionFromHash(hash) {
    const p = params(hash);
    const get = (k, d) => (p.has(k) ? p.get(k) : d);
    const step = Number(get('step', 'x'));
    const q = Number(get('q', '1'));
    const head = Number(get('head', '0'));
    const colour = get('colour', 'auto');
    const slide = get('slide', '');
    const layer = get('layer', 'x');
    const bstage = get('bstage', '');
    return {
      step: Number.isInteger(step) && step >= 0 ? step : null,
      query: Number.isInteger(q) && q >= 0 ? q : 1,
      head: Number.isInteger(head) && head >= 0 ? head : 0,
      colour: SCALE_MODES.includes(colour) ? colour : 'auto',
      present: get('present', '0') === '1',
      slide: /^[a-z_]{1,32}$/.test(slide) ? slide : null,
      layer: /^\d{1,3}$/.test(layer) ? Number(layer) : null,
      bstage: /^[a-z_0-9]{1,32}$/.test(bstage) ? bstage : null,
      // ---- the view's own settings for a lecture hall, only when the address sets them (a reader takes the
      // default otherwise): the text scale, a percentage of TEXT_SCALES
      ...(TEXT_SCALES.includes(Number(get('text', '100')) / 100) && get('text', '100') !== '100'
        ? { text: Number(get('text', '100')) / 100 } : {}),
      ...(/^\d{1,4}$/.test(get('key', '')) ? { key: Number(get('key', '')) } : {}),
      ...(THEMES.includes(get('theme', '')) && get('theme', '') !== 'system' ? { theme: get('theme', '') } : {}),
    };
  }

  /** The projector text scales the page offers (× the text size; present mode's 125% on top). */
  const TEXT_SCALES = Object.freeze([1, 1.25, 1.5, 2]);
  /** The colour themes: the system's preference (light or dark, more contrast), or one chosen (style.css). */
  const THEMES = Object.freeze(['system', 'light', 'dark', 'contrast']);

  globalThis.AttentionTrace.urlState = Object.freeze({
    DEFAULTS, DEFAULT_FIELDS, BLOCKS, HEAD_KINDS, headKinds, kindsText, PRESET_FIELDS, withPreset, readInt, splitLines, requestFrom, fieldsFromTrace, comparisonBody, divisors, dkCard, fieldError, curlFor,
    hashFor, fieldsFromHash, selectionFromHash, UI_WORDS, uiWords, TEXT_SCALES, THEMES,
  });
})();
