/*
 * attention-trace viewer.
 *
 * A plain client of the public JSON API, exactly as a third-party frontend
 * would be: it POSTs /trace (once, and once more with scale flipped for the
 * saturation comparison only when the first is valid), POSTs /explain for a
 * clicked cell and /trace/html for the offline export, GETs /version, and
 * draws what comes back. It computes nothing of the attention itself; the
 * only arithmetic here is formatting, colour scales, a row sum shown as a
 * check, and the element-wise average of the heads, which the page shows as
 * the thing the model does *not* do.
 *
 * The same script draws a saved trace (service/standalone.py): when the page
 * embeds one (<script type="application/json" id="trace-data">), it draws
 * that, read-only, and never makes a request.
 *
 * Runs under a strict Content-Security-Policy: no inline script or style, DOM
 * built with createElement/textContent only (no HTML strings are parsed), colours set
 * through CSS custom properties via the CSSOM. SVG downloads are built as DOM
 * (createElementNS) and serialised with XMLSerializer.
 *
 * Heads, tokens and K/V heads are numbered from 0 everywhere, as in the API
 * (and the command line's "Head 0 of 4").
 */
'use strict';

(() => {
  const MINUS = '\u2212';
  const DEFAULTS = Object.freeze({
    sentence: 'the cat sat', d_model: 24, num_heads: 1, seed: 0, scale: true, causal: false,
    positional_encoding: 'sinusoidal', rope_base: 10000, rope_pairing: 'rotate_half',
  });
  const limits = { max_d_model: 512, max_heads: 64, max_tokens: 256 };
  const HEATMAP_MAX_TOKENS = 48; // more than this many tokens: draw the first 48 only
  const CELL_NUMBERS_MAX_TOKENS = 12; // above this, cells show colour only; the readout has the value
  const THUMBS_MAX_CELLS = 30000;
  const VECTOR_NUMBERS_MAX = 96;
  // Keystroke to numbers: a trace and its drawing take 20-80 ms; the debounce only has to skip the keys of
  // one burst of typing (docs/viewer.md has the measurements).
  const DEBOUNCE_MS = 120;
  const SLIDER_DEBOUNCE_MS = 60;
  const PENDING_NOTE_MS = 400; // "Checking with the service…" only for an answer slower than this
  const SVG_NS = 'http://www.w3.org/2000/svg'; // an XML namespace name, never fetched
  const EMBED = readEmbedded();
  const STANDALONE = EMBED !== null;

  const state = {
    query: 1, // selected query token index
    queryText: 'cat',
    head: 0, // selected head index (0-based)
    step: null, // selected KV-cache decoding step (null: the last one)
    main: null, // {doc, text, body, ms}: the trace for the inputs as set
    alt: null, // the same request with scale flipped
    altError: null,
    altPending: false, // the comparison of the trace on screen is on its way
    seq: 0,
    controller: null,
    timer: 0,
    pendingTimer: 0,
    dkKey: null, // the d_k-relevant inputs the card describes
    dkAnswered: false, // whether the service has answered for them
    explain: null, // {head, query, key}: the cell whose explanation is shown
    explainController: null,
    serviceVersion: null,
  };

  const $ = (id) => document.getElementById(id);
  const ui = {
    form: $('controls'), sentence: $('sentence'), dModel: $('d_model'), heads: $('num_heads'),
    headsValue: $('num_heads-value'), divisors: $('head-divisors'), seed: $('seed'),
    pe: $('positional_encoding'), scale: $('scale'), causal: $('causal'),
    ropeFields: $('rope-fields'), ropeBase: $('rope_base'), ropePairing: $('rope_pairing'),
    kvHeads: $('num_kv_heads'), window: $('window'), contextSentence: $('context_sentence'), decode: $('decode'),
    contextTokens: $('context_tokens'),
    kvSection: $('kv-section'), kvBody: $('kv-body'),
    decodeSection: $('decode-section'), decodeBody: $('decode-body'), decodeStep: $('decode-step'),
    decodeStepValue: $('decode-step-value'),
    factMatricesLabel: $('fact-matrices-label'), factParamsLabel: $('fact-params-label'),
    dkCard: $('dk-card'), dkDModel: $('dk-dmodel'), dkHeads: $('dk-heads'), dkValue: $('dk-value'),
    dkStatus: $('dk-status'), dkMessage: $('dk-message'),
    factMatrices: $('fact-matrices'), factParams: $('fact-params'), factScale: $('fact-scale'),
    factScaleLabel: $('fact-scale-label'),
    copy: $('copy-curl'), download: $('download-json'), downloadHtml: $('download-html'),
    actionStatus: $('action-status'), curl: $('curl-command'),
    main: $('main'), tokenOptions: $('token-options'), headOptions: $('head-options'), traceStatus: $('trace-status'),
    problem: $('problem'), results: $('results'),
    walkthrough: $('walkthrough-body'), walkthroughTitle: $('walkthrough-title'),
    maps: $('maps-body'), mapsTitle: $('maps-title'), readout: $('maps-readout'), thumbs: $('thumbs-body'),
    saturation: $('saturation-body'), saturationSection: $('saturation'), saturationSvg: $('download-saturation-svg'),
    multihead: $('multihead-body'), footer: $('footer-versions'),
    explainSection: $('explain-section'), explainStatus: $('explain-status'), explainBody: $('explain-body'),
  };
  const fieldErrors = {
    '/sentence': $('sentence-error'), '/tokens': $('sentence-error'), '/d_model': $('d_model-error'),
    '/seed': $('seed-error'), '/positional_encoding': $('positional_encoding-error'),
    '/rope_base': $('rope_base-error'), '/rope_pairing': $('rope_pairing-error'),
    '/num_kv_heads': $('num_kv_heads-error'), '/window': $('window-error'),
    '/context_sentence': $('context_sentence-error'), '/context_tokens': $('context_tokens-error'),
    '/scale': $('scale-error'), '/causal': $('causal-error'), '/decode': $('decode-error'),
  };
  const fieldInputs = {
    '/sentence': ui.sentence, '/tokens': ui.sentence, '/d_model': ui.dModel, '/num_heads': ui.heads, '/seed': ui.seed,
    '/positional_encoding': ui.pe, '/rope_base': ui.ropeBase, '/rope_pairing': ui.ropePairing,
    '/num_kv_heads': ui.kvHeads, '/window': ui.window, '/context_sentence': ui.contextSentence,
    '/context_tokens': ui.contextTokens, '/scale': ui.scale, '/causal': ui.causal, '/decode': ui.decode,
  };

  // ------------------------------------------------------------------ helpers

  /** createElement with properties; never parses HTML. */
  function h(tag, props, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = v;
      else if (k === 'data') Object.assign(node.dataset, v);
      else if (k === 'vars') for (const [name, val] of Object.entries(v)) node.style.setProperty(name, val);
      else if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      node.append(kid instanceof Node ? kid : String(kid));
    }
    return node;
  }

  /** Fixed decimals with a real minus sign and no "-0.000". */
  function fmt(x, digits = 4) {
    if (x === null || x === undefined) return 'masked';
    let s = x.toFixed(digits);
    if (s.startsWith('-')) s = /^-[0.]*$/.test(s) ? s.slice(1) : MINUS + s.slice(1);
    return s;
  }
  const pct = (w, digits = 1) => `${fmt(w * 100, digits)}%`;
  /** 4 decimals, or 4 significant digits for a tiny non-zero number (an exponential, say), never a bare 0.0000. */
  function fmtSmall(x) {
    if (x === null || x === undefined) return 'masked';
    if (x !== 0 && Math.abs(x) < 0.001) return x.toExponential(3).replace(/-/g, MINUS);
    return fmt(x, 4);
  }
  const int = (n) => n.toLocaleString('en-US');
  const quoted = (t) => `“${t}”`;
  /** Shown as `visual` (with <sub>), read as `text`: screen readers would run "d<sub>model</sub>" into "dmodel". */
  const spoken = (visual, text) => [h('span', { 'aria-hidden': 'true' }, visual), h('span', { class: 'visually-hidden', text })];
  /** base with a subscript, read as "base_sub". */
  const sub = (text, base = 'd') => h('span', {}, spoken([base, h('sub', { text })], `${base}_${text}`));

  function extent(values) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const v of values.flat(Infinity)) {
      if (v === null) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (lo === Infinity) return [0, 1];
    return [lo, hi];
  }
  const unit = (v, [lo, hi]) => (hi > lo ? (v - lo) / (hi - lo) : 0.5);

  /** A cell coloured on the sequential scale: --t in [0, 1], dark ink flips to light. */
  function shade(node, t) {
    node.style.setProperty('--t', t.toFixed(4));
    node.classList.toggle('on-dark', t > 0.6); // where white and black ink have equal contrast (4.6:1)
    return node;
  }

  function norm(v) {
    return Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  }

  /** The tokens along the key axis: the context's in cross-attention, else the sentence's. */
  const keyTokensOf = (doc) => doc.context_tokens || doc.tokens;
  const isCross = (doc) => Array.isArray(doc.context_tokens);

  /** Which K/V head query head `hd` reads (itself, without GQA). */
  function kvHeadOf(cfg, hd) {
    const groups = cfg.query_heads_of_kv_head;
    if (!groups) return hd;
    const g = groups.findIndex((heads) => heads.includes(hd));
    return g < 0 ? 0 : g;
  }

  function shellQuote(s) {
    return `'${s.replace(/'/g, "'\\''")}'`;
  }

  // ------------------------------------------------------------------ inputs

  function readInt(input) {
    const raw = input.value.trim();
    if (!/^\d+$/.test(raw)) return null;
    const n = Number(raw);
    return Number.isSafeInteger(n) ? n : null;
  }

  /** The request the inputs describe, or {error} for what JSON cannot carry. */
  function readRequest() {
    const errors = {};
    const dModel = readInt(ui.dModel);
    const seed = readInt(ui.seed);
    const heads = readInt(ui.heads);
    if (dModel === null) errors['/d_model'] = 'enter a whole number, 1 or more';
    if (seed === null) errors['/seed'] = 'enter a whole number, 0 or more';
    const body = {
      sentence: ui.sentence.value,
      d_model: dModel,
      num_heads: heads,
      seed,
      scale: ui.scale.checked,
      causal: ui.causal.checked,
      positional_encoding: ui.pe.value,
    };
    // The variants' fields are sent only when used, so a plain request stays plain.
    if (body.positional_encoding === 'rope') {
      const raw = ui.ropeBase.value.trim();
      const base = raw === '' ? DEFAULTS.rope_base : Number(raw);
      if (!Number.isFinite(base)) errors['/rope_base'] = 'enter a number greater than 1';
      body.rope_base = Number.isFinite(base) ? base : null;
      body.rope_pairing = ui.ropePairing.value;
    }
    if (ui.kvHeads.value.trim() !== '') {
      body.num_kv_heads = readInt(ui.kvHeads);
      if (body.num_kv_heads === null) errors['/num_kv_heads'] = 'enter a whole number, 1 or more (or leave it empty)';
    }
    if (ui.window.value.trim() !== '') {
      body.window = readInt(ui.window);
      if (body.window === null) errors['/window'] = 'enter a whole number, 1 or more (or leave it empty)';
    }
    if (ui.contextSentence.value !== '') body.context_sentence = ui.contextSentence.value;
    if (ui.contextTokens.value !== '') body.context_tokens = splitLines(ui.contextTokens.value);
    if (ui.decode.checked) body.decode = true;
    return { body, errors };
  }

  /** Pre-split tokens, one a line (a final line break is not an empty token). */
  const splitLines = (text) => text.replace(/\n+$/, '').split('\n');

  /** Set a node's text only when it changes (no mutation, nothing re-announced, when it does not). */
  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  function divisors(n) {
    const out = [];
    for (let i = 1; i <= Math.min(n, limits.max_heads); i += 1) if (n % i === 0) out.push(i);
    return out;
  }

  /** The inputs the d_k card describes: d_model, h, the K/V heads and the scale switch. */
  const dkKey = () => JSON.stringify([ui.dModel.value.trim(), ui.heads.value, ui.kvHeads.value.trim(), ui.scale.checked]);

  /**
   * The d_k card from the inputs as typed, before the service answers: every number on it describes that one
   * configuration (never the last valid trace's), and a count that configuration does not have is "—".
   */
  function updateDkLive() {
    const dModel = readInt(ui.dModel);
    const heads = readInt(ui.heads);
    const gqa = ui.kvHeads.value.trim() !== '';
    const kv = gqa ? readInt(ui.kvHeads) : null;
    ui.headsValue.value = String(heads ?? '');
    setText(ui.headsValue, String(heads ?? ''));
    setText(ui.dkDModel, dModel === null ? '?' : String(dModel));
    setText(ui.dkHeads, String(heads ?? '?'));
    ui.ropeFields.hidden = ui.pe.value !== 'rope';
    setFactLabels(gqa, ui.scale.checked);
    const dk = dModel !== null && heads ? dModel / heads : null;
    const whole = dk !== null && Number.isInteger(dk);
    const kvOk = !gqa || (kv !== null && kv >= 1 && heads !== null && heads % kv === 0);
    setText(ui.dkValue, dk === null ? '?' : whole ? String(dk) : String(Number(dk.toFixed(3))));
    // GQA: W_Q and W_O stay d_model × d_model; W_K and W_V shrink to kv·d_k rows each.
    setText(ui.factMatrices, heads && kvOk ? String(gqa ? heads + 2 * kv + 1 : 3 * heads + 1) : '—');
    setText(ui.factParams, dModel === null || !kvOk || (gqa && !whole) ? '—'
      : int(gqa ? 2 * dModel * dModel + 2 * kv * dk * dModel : 4 * dModel * dModel));
    setText(ui.factScale, !ui.scale.checked ? fmt(1, 4) : whole ? fmt(Math.sqrt(dk), 4) : '—');
    if (dModel !== null) {
      // The slider spans 1 … d_model (never below the current value, so typing never clamps it).
      const top = Math.min(limits.max_heads, Math.max(dModel, heads || 1, 2));
      if (ui.heads.max !== String(top)) ui.heads.max = String(top);
    }
    if (dModel !== null && ui.divisors.dataset.for !== String(dModel)) {
      ui.divisors.replaceChildren(...divisors(dModel).map((d) => h('option', { value: d, label: String(d) })));
      ui.divisors.dataset.for = String(dModel);
    }
    return { dModel, heads, dk, whole };
  }

  /**
   * The card's verdict on the head split from the inputs alone: d_model mod h is arithmetic, not a guess. The
   * service's own words follow when it answers (the red card's message is always the service's).
   */
  function dkVerdict(live) {
    if (live.dModel === null) {
      setDkState('invalid', 'Not a valid d_model', 'd_model: enter a whole number, 1 or more');
    } else if (live.heads === null) {
      setDkState('pending', 'Waiting for a valid request', '');
    } else if (live.whole) {
      setDkState('valid', `${live.dModel} / ${live.heads} = ${live.dk}: each head works in ${live.dk} dimensions`, '');
    } else {
      // The message slot stays empty until the service's arrives: no earlier configuration's message lingers.
      setDkState('invalid', 'Not a valid head split', '');
    }
  }

  /** The formulas beside the counts: multi-head or grouped-query; the divisor √d_k, or 1 with scaling off. */
  function setFactLabels(gqa, scaled) {
    const mode = `${gqa}:${scaled}`;
    if (ui.factMatricesLabel.dataset.mode === mode) return;
    ui.factMatricesLabel.dataset.mode = mode;
    ui.factMatricesLabel.replaceChildren(gqa ? 'h + 2·kv + 1' : '3h + 1');
    ui.factParamsLabel.replaceChildren(...(gqa
      ? spoken(['2·d', h('sub', { text: 'model' }), '² + 2·kv·d', h('sub', { text: 'k' }), '·d', h('sub', { text: 'model' })],
        '2·d_model² + 2·kv·d_k·d_model')
      : spoken(['4·d', h('sub', { text: 'model' }), '²'], '4·d_model²')));
    ui.factScaleLabel.replaceChildren(...(scaled ? spoken(['√d', h('sub', { text: 'k' })], '√d_k') : ['1 (scaling off)']));
  }

  function setDkState(kind, status, message) {
    for (const k of ['valid', 'invalid', 'pending']) ui.dkCard.classList.toggle(`is-${k}`, k === kind);
    setText(ui.dkStatus, status);
    if (ui.dkMessage.hidden !== !message) ui.dkMessage.hidden = !message;
    setText(ui.dkMessage, message || '');
  }

  /** The service answered for the inputs the card shows: no "Checking…" note for them any more. */
  function dkAnswered() {
    state.dkAnswered = true;
    clearTimeout(state.pendingTimer);
  }

  function clearFieldErrors() {
    for (const [pointer, node] of Object.entries(fieldErrors)) {
      node.hidden = true;
      node.textContent = '';
      fieldInputs[pointer].removeAttribute('aria-invalid');
    }
    ui.heads.removeAttribute('aria-invalid');
  }

  /** Show a service message next to its field; /num_heads goes to the d_k card (the slider points at it). */
  function showFieldError(pointer, message) {
    if (pointer === '/num_heads') {
      ui.heads.setAttribute('aria-invalid', 'true');
      return true;
    }
    // An item of a list (/context_tokens/1) belongs to the list's field.
    const field = fieldErrors[pointer] ? pointer : `/${pointer.split('/')[1] || ''}`;
    const node = fieldErrors[field];
    if (!node) return false;
    const rest = pointer.slice(field.length + 1);
    const text = field === pointer ? message
      : field === '/context_tokens' && /^\d+$/.test(rest) ? `line ${Number(rest) + 1} (token ${rest}): ${message}` : `${rest}: ${message}`;
    node.hidden = false;
    node.textContent = node.textContent ? `${node.textContent}; ${text}` : text;
    fieldInputs[field].setAttribute('aria-invalid', 'true');
    return true;
  }

  // ------------------------------------------------------------------ URL state

  function writeHash(body) {
    const p = new URLSearchParams();
    if (STANDALONE) { // a saved trace: only the selection lives in the address
      writeSelection(p);
      return;
    }
    p.set('sentence', body.sentence);
    for (const k of ['d_model', 'num_heads', 'seed']) if (body[k] !== null) p.set(k, String(body[k]));
    p.set('scale', body.scale ? '1' : '0');
    p.set('causal', body.causal ? '1' : '0');
    if (body.positional_encoding !== 'sinusoidal') p.set('pe', body.positional_encoding);
    if (body.positional_encoding === 'rope') {
      if (ui.ropeBase.value.trim() !== String(DEFAULTS.rope_base)) p.set('rope_base', ui.ropeBase.value.trim());
      if (body.rope_pairing !== DEFAULTS.rope_pairing) p.set('rope_pairing', body.rope_pairing);
    }
    if (ui.kvHeads.value.trim() !== '') p.set('kv', ui.kvHeads.value.trim());
    if (ui.window.value.trim() !== '') p.set('window', ui.window.value.trim());
    if ('context_sentence' in body) p.set('context', body.context_sentence);
    for (const t of body.context_tokens || []) p.append('ctok', t);
    if (body.decode) p.set('decode', '1');
    writeSelection(p);
  }

  function writeSelection(p) {
    if (state.step !== null && (STANDALONE ? Array.isArray(state.main?.doc.decode) : ui.decode.checked)) {
      p.set('step', String(state.step));
    }
    p.set('q', String(state.query));
    p.set('head', String(state.head)); // 0-based, as in the API
    const hash = `#${p.toString()}`;
    if (location.hash !== hash) history.replaceState(null, '', hash);
  }

  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    const get = (k, d) => (p.has(k) ? p.get(k) : d);
    const whole = (k, d) => (/^\d{1,10}$/.test(get(k, '')) ? get(k, '') : String(d));
    ui.sentence.value = get('sentence', DEFAULTS.sentence);
    ui.dModel.value = whole('d_model', DEFAULTS.d_model);
    ui.heads.max = String(limits.max_heads); // before the value, which the range input would clamp
    ui.heads.value = whole('num_heads', DEFAULTS.num_heads);
    ui.seed.value = whole('seed', DEFAULTS.seed);
    ui.scale.checked = get('scale', '1') !== '0';
    ui.causal.checked = get('causal', '0') === '1';
    const pe = get('pe', 'sinusoidal');
    ui.pe.value = ['none', 'rope'].includes(pe) ? pe : 'sinusoidal';
    const base = get('rope_base', String(DEFAULTS.rope_base));
    ui.ropeBase.value = /^[0-9.eE+]{1,24}$/.test(base) ? base : String(DEFAULTS.rope_base);
    ui.ropePairing.value = get('rope_pairing', DEFAULTS.rope_pairing) === 'interleaved' ? 'interleaved' : 'rotate_half';
    ui.kvHeads.value = /^\d{1,10}$/.test(get('kv', '')) ? get('kv', '') : '';
    ui.window.value = /^\d{1,10}$/.test(get('window', '')) ? get('window', '') : '';
    ui.contextSentence.value = get('context', '');
    ui.contextTokens.value = p.getAll('ctok').join('\n');
    ui.decode.checked = get('decode', '0') === '1';
    readSelection(p);
  }

  /** The query token, head and decoding step from the address. */
  function readSelection(p) {
    const get = (k, d) => (p.has(k) ? p.get(k) : d);
    const step = Number(get('step', 'x'));
    state.step = Number.isInteger(step) && step >= 0 ? step : null;
    const q = Number(get('q', '1'));
    state.query = Number.isInteger(q) && q >= 0 ? q : 1;
    state.queryText = null;
    const head = Number(get('head', '0'));
    state.head = Number.isInteger(head) && head >= 0 ? head : 0;
  }

  // ------------------------------------------------------------------ the API

  class ServiceError extends Error {
    constructor(status, problem, text) {
      super(problem?.detail || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
      this.text = text;
    }
  }

  // The endpoints, each a literal fetch of this origin (tests/test_viewer.py lists them against openapi.yaml).
  const ENDPOINTS = {
    trace: (init) => fetch('trace', init),
    explain: (init) => fetch('explain', init),
    html: (init) => fetch('trace/html', init),
  };

  /** POST a JSON body; the parsed answer, or a ServiceError with the problem document. */
  async function postJson(endpoint, body, signal) {
    if (STANDALONE) throw new Error('a saved trace makes no request'); // and its CSP would refuse one
    const started = performance.now();
    const res = await endpoint({
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, application/problem+json' },
      body: JSON.stringify(body),
      signal,
    });
    const text = await res.text();
    let doc = null;
    try {
      doc = JSON.parse(text);
    } catch {
      doc = null;
    }
    if (!res.ok || doc === null || typeof doc !== 'object') throw new ServiceError(res.status, doc, text);
    return { doc, text, body, ms: performance.now() - started };
  }

  async function loadLimits() {
    if (STANDALONE) return;
    try {
      const res = await fetch('version', { headers: { Accept: 'application/json' } });
      if (!res.ok) return;
      const info = await res.json();
      Object.assign(limits, info.limits || {});
      ui.dModel.max = String(limits.max_d_model);
      state.serviceVersion = info.service_version;
      renderFooter();
      delete ui.divisors.dataset.for;
      updateDkLive();
    } catch {
      // The defaults stand; /trace reports any limit that matters.
    }
  }

  /** An input changed: redraw the card from the inputs now, ask the service after `delay` ms. */
  function schedule(delay) {
    clearTimeout(state.timer);
    // The inputs changed: an answer still in flight describes old inputs; cancel it (it will never draw).
    state.seq += 1;
    if (state.controller) state.controller.abort();
    state.controller = null;
    const live = updateDkLive();
    const key = dkKey();
    if (key !== state.dkKey) { // only a field the card shows changes its verdict; the sentence never does
      state.dkKey = key;
      state.dkAnswered = false;
      clearTimeout(state.pendingTimer);
      dkVerdict(live);
    }
    state.timer = setTimeout(refresh, delay);
  }

  /** The comparison request: the same with scale flipped (and without decoding: it needs the weights only). */
  function comparisonBody(body) {
    const alt = { ...body, scale: !body.scale };
    delete alt.decode;
    return alt;
  }

  async function refresh() {
    const { body, errors } = readRequest();
    const seq = ++state.seq;
    if (state.controller) state.controller.abort();
    state.controller = null;
    writeHash(body);
    renderCurl(body);
    if (Object.keys(errors).length) {
      clearFieldErrors();
      for (const [pointer, message] of Object.entries(errors)) showFieldError(pointer, message);
      dkAnswered();
      if (errors['/d_model']) setDkState('invalid', 'Not a valid d_model', `d_model: ${errors['/d_model']}`);
      abandonComparison();
      showProblem(null);
      ui.main.setAttribute('aria-busy', 'false');
      markStale(true, 'Fix the highlighted input to update.');
      return;
    }
    const controller = new AbortController();
    state.controller = controller;
    ui.main.setAttribute('aria-busy', 'true');
    // A note for a slow answer only: a fast one replaces the numbers without a flash of "Computing…".
    clearTimeout(state.pendingTimer);
    state.pendingTimer = setTimeout(() => {
      if (seq !== state.seq) return;
      ui.traceStatus.textContent = 'Computing…';
      if (!state.dkAnswered) setDkState('pending', 'Checking with the service…', '');
    }, PENDING_NOTE_MS);
    // The request as set first; the comparison (scale flipped) only once that one is valid, so an
    // invalid request is sent once, and its 422 is the one explanation shown.
    let main;
    try {
      main = await postJson(ENDPOINTS.trace, body, controller.signal);
    } catch (err) {
      if (seq !== state.seq || err?.name === 'AbortError') return; // a newer request is on its way
      state.controller = null;
      dkAnswered();
      ui.main.setAttribute('aria-busy', 'false');
      clearFieldErrors();
      abandonComparison();
      showError(err);
      if (!state.main) {
        ui.walkthrough.replaceChildren(h('p', { class: 'hint', text: 'No trace yet: fix the inputs to see one.' }));
      }
      return;
    }
    if (seq !== state.seq) return;
    dkAnswered();
    clearFieldErrors();
    // Draw the numbers now; the comparison follows (its section is marked busy until then).
    state.alt = null;
    state.altError = null;
    state.altPending = true;
    showTrace(main);
    try {
      state.alt = await postJson(ENDPOINTS.trace, comparisonBody(body), controller.signal);
    } catch (err) {
      if (seq !== state.seq || err?.name === 'AbortError') return;
      state.altError = err;
    }
    if (seq !== state.seq) return;
    state.controller = null;
    state.altPending = false;
    ui.main.setAttribute('aria-busy', 'false');
    renderSaturation();
  }

  /** The comparison of the trace on screen was cancelled by newer inputs that turned out invalid: say so. */
  function abandonComparison() {
    if (!state.altPending || !state.main) return;
    state.altPending = false;
    state.altError = new Error('the inputs changed before it answered');
    renderSaturation();
  }

  /** A valid trace (from the service, or embedded in a saved page): the card, the actions and every section. */
  function showTrace(main) {
    state.main = main;
    showProblem(null);
    markStale(false);
    const cfg = main.doc.config;
    setDkState('valid', `${cfg.d_model} / ${cfg.num_heads} = ${cfg.d_k}: each head works in ${cfg.d_k} dimensions`, '');
    setFactLabels(cfg.num_kv_heads !== undefined, cfg.scale);
    setText(ui.dkValue, String(cfg.d_k));
    setText(ui.factMatrices, String(cfg.n_matrices));
    setText(ui.factParams, int(cfg.n_parameters));
    setText(ui.factScale, fmt(cfg.scale_factor, 4));
    ui.download.disabled = false;
    ui.downloadHtml.disabled = false;
    clearExplain('The inputs changed: click a cell (or press Enter on it) to explain it.');
    render();
  }

  /** A failed request: field messages inline, the rest in the alert; nothing else breaks. */
  function showError(err) {
    let title;
    let details = [];
    const dkMessages = [];
    if (err instanceof ServiceError && err.problem && typeof err.problem === 'object') {
      const p = err.problem;
      title = `${p.title || 'Error'} (HTTP ${p.status || err.status})`;
      const items = Array.isArray(p.errors) ? p.errors : [];
      for (const item of items) {
        const pointer = item.pointer || '';
        const message = item.message || p.detail || '';
        if (pointer === '/num_heads') dkMessages.push(message);
        showFieldError(pointer, message);
        details.push(`${pointer ? pointer.slice(1) : 'request'}: ${message}`);
      }
      if (!items.length) details.push(p.detail || err.text || `HTTP ${err.status}`);
    } else if (err instanceof ServiceError) {
      title = `The service answered HTTP ${err.status} without a problem document`;
      details = [String(err.text || '').slice(0, 300) || 'empty body'];
    } else {
      title = 'Could not reach the service';
      details = [`${err?.message || err}. Is it running? Try again in a moment.`];
    }
    if (dkMessages.length) {
      setDkState('invalid', 'Not a valid head split', dkMessages.join(' '));
    } else if (fieldErrors['/d_model'].textContent !== '') {
      setDkState('invalid', 'Not a valid d_model', `d_model: ${fieldErrors['/d_model'].textContent}`);
    } else {
      dkVerdict(updateDkLive()); // the split itself is sound; the problem is elsewhere, and shown there
    }
    ui.download.disabled = true;
    ui.downloadHtml.disabled = true;
    clearExplain('No valid trace: fix the inputs, then click a cell to explain it.');
    showProblem({ title, details });
    markStale(true, dkMessages.length ? 'Pick a head count that divides d_model to update.' : 'Fix the request to update.');
  }

  function showProblem(problem) {
    if (!problem) {
      ui.problem.hidden = true;
      ui.problem.replaceChildren();
      return;
    }
    ui.problem.hidden = false;
    ui.problem.replaceChildren(
      h('p', { class: 'problem-title', text: problem.title }),
      h('ul', { class: 'problem-list' }, problem.details.map((d) => h('li', { text: d }))),
    );
  }

  function markStale(stale, why) {
    ui.results.classList.toggle('is-stale', stale && !!state.main);
    clearTimeout(state.pendingTimer);
    if (stale) {
      ui.traceStatus.textContent = state.main
        ? `${why} Below: the last valid trace.`
        : why;
    }
  }

  // ------------------------------------------------------------------ rendering

  function render() {
    const doc = state.main.doc;
    const tokens = doc.tokens;
    const cfg = doc.config;
    // Keep the same query token across edits when it is still there.
    if (state.queryText !== null && tokens[state.query]?.text !== state.queryText) {
      const same = tokens.findIndex((t) => t.text === state.queryText);
      if (same >= 0) state.query = same;
    }
    state.query = Math.min(Math.max(state.query, 0), tokens.length - 1);
    state.queryText = tokens[state.query].text;
    state.head = Math.min(state.head, cfg.num_heads - 1);
    writeHash(readRequest().body);
    renderPickers();
    renderSelection();
    const extras = [];
    if (cfg.positional_encoding === 'rope') extras.push(`RoPE ${cfg.rope_pairing === 'interleaved' ? 'interleaved' : 'rotate-half'}`);
    if (cfg.num_kv_heads !== undefined) extras.push(`${cfg.num_kv_heads} K/V head${cfg.num_kv_heads === 1 ? '' : 's'}`);
    if (cfg.window !== undefined) extras.push(`window ${cfg.window}`);
    if (isCross(doc)) extras.push(`cross-attention to ${cfg.n_context_tokens} context token${cfg.n_context_tokens === 1 ? '' : 's'}`);
    if (cfg.decode) extras.push('KV-cache decoding');
    ui.traceStatus.textContent = `${tokens.length} token${tokens.length === 1 ? '' : 's'} · d_model ${cfg.d_model} · `
      + `${cfg.num_heads} head${cfg.num_heads === 1 ? '' : 's'} of d_k ${cfg.d_k}${extras.map((e) => ` · ${e}`).join('')}`
      + (state.main.ms === null ? ' · a saved trace' : ` · traced in ${Math.round(state.main.ms)} ms`);
    renderFooter();
  }

  function renderFooter() {
    const parts = [`attention-trace ${state.serviceVersion || ''}`.trim()];
    const doc = state.main?.doc;
    if (doc) {
      parts.push(`engine ${doc.engine_version}`, `schema ${doc.schema_version}`,
        `weights ${doc.parameters_digest.slice(0, 'sha256:'.length + 12)}…`);
    }
    ui.footer.textContent = parts.join(' · ');
  }

  /** Everything that depends on the chosen query token and head. */
  function renderSelection() {
    renderWalkthrough();
    renderMaps();
    renderKv();
    renderDecode();
    renderSaturation();
    renderMultihead();
  }

  function select(query, head, { focus } = {}) {
    if (!state.main) return;
    if (query !== null) {
      state.query = query;
      state.queryText = state.main.doc.tokens[query].text;
    }
    if (head !== null) state.head = head;
    writeHash(readRequest().body);
    syncPickers();
    renderSelection();
    if (focus) focus();
  }

  function renderPickers() {
    const doc = state.main.doc;
    ui.tokenOptions.replaceChildren(...doc.tokens.map((t) => {
      const input = h('input', {
        type: 'radio', name: 'query', value: t.index, id: `query-${t.index}`, class: 'chip-input',
        'aria-label': `${t.text} (token ${t.index})`,
        onchange: () => select(t.index, null),
      });
      return h('label', { class: 'chip', for: `query-${t.index}`, data: { index: t.index } },
        input, h('span', { class: 'chip-text', text: t.text }), h('span', { class: 'chip-index', text: t.index }));
    }));
    const heads = doc.config.num_heads;
    ui.headOptions.replaceChildren(...Array.from({ length: heads }, (_, i) => {
      const input = h('input', {
        type: 'radio', name: 'head', value: i, id: `head-${i}`, class: 'chip-input',
        'aria-label': `head ${i} of ${heads}`,
        onchange: () => select(null, i),
      });
      return h('label', { class: 'chip chip-head', for: `head-${i}` }, input, h('span', { class: 'chip-text', text: `${i}` }));
    }));
    syncPickers();
  }

  function syncPickers() {
    for (const input of ui.tokenOptions.querySelectorAll('input')) input.checked = Number(input.value) === state.query;
    for (const input of ui.headOptions.querySelectorAll('input')) input.checked = Number(input.value) === state.head;
  }

  // -- walkthrough

  function vec(values, digits = 3, limit = 8) {
    const shown = values.slice(0, limit).map((v, i) => h('span', { class: 'num', data: { i } }, fmt(v, digits)));
    const wrap = h('span', { class: 'vec', 'aria-label': `${values.length} values` },
      h('span', { class: 'bracket', text: '[' }), shown.slice(0, -1),
      h('span', { class: 'vec-end' }, shown.slice(-1), values.length > limit ? h('span', { class: 'ellipsis', text: ' …' }) : null,
        h('span', { class: 'bracket', text: ' ]' })));
    if (values.length <= limit) return wrap;
    return h('span', { class: 'vec-wrap' }, wrap, h('details', { class: 'vec-more' },
      h('summary', { text: `all ${values.length} values` }),
      h('span', { class: 'vec vec-all' }, values.map((v, i) => h('span', { class: 'num', data: { i } }, fmt(v, digits))))));
  }

  function keyList(stage, tokens, values, show) {
    return h('ul', { class: 'keys', data: { stage } }, tokens.map((t, j) => {
      const v = values[j];
      const masked = v === null;
      return h('li', { class: masked ? 'key is-masked' : 'key', data: { key: j } },
        h('span', { class: 'tok', text: t.text }), h('span', { class: 'arrow', 'aria-hidden': 'true', text: '→' }),
        show(v, masked));
    }));
  }

  function stageRow(stage, name, op, result) {
    return h('tr', { data: { stage } },
      h('th', { scope: 'row', class: 'wt-stage' }, name),
      h('td', { class: 'wt-op' }, op),
      h('td', { class: 'wt-result' }, result));
  }

  function vecLine(part, name, values, className = 'vec-line') {
    return h('div', { class: className, data: { part } }, h('span', { class: 'vec-name', text: name }), vec(values));
  }

  const KEY_VECTORS_MAX = 12; // context keys listed with their vectors in the walkthrough

  /** One vector per context token (cross-attention's keys, values and inputs), capped for long contexts. */
  function tokenVectors(part, label, ctxTokens, rows) {
    const shown = ctxTokens.slice(0, KEY_VECTORS_MAX);
    // Open for a short context; a longer one folds away behind its summary (arrow keys reach it, Enter opens it).
    return h('details', { class: 'ctx-vectors', open: ctxTokens.length <= 3 },
      h('summary', { text: `${label} for each of the ${ctxTokens.length} context token${ctxTokens.length === 1 ? '' : 's'}` }),
      h('div', { class: 'stack' },
        shown.map((t, j) => vecLine(`${part}:${j}`, `${label}_${t.text} =`, rows[j])),
        ctxTokens.length > shown.length
          ? h('p', { class: 'hint', text: `… and ${ctxTokens.length - shown.length} more: download the JSON for all of them.` }) : null));
  }

  function renderWalkthrough() {
    const { doc } = state.main;
    const S = doc.stages;
    const cfg = doc.config;
    const q = state.query;
    const hd = state.head;
    const tokens = doc.tokens;
    const keyTokens = keyTokensOf(doc);
    const cross = isCross(doc);
    const rope = cfg.positional_encoding === 'rope';
    const gqa = cfg.num_kv_heads !== undefined && cfg.num_kv_heads !== cfg.num_heads;
    const kvh = kvHeadOf(cfg, hd);
    const tok = tokens[q].text;
    const headName = cfg.num_heads > 1 ? ` · head ${hd} of ${cfg.num_heads}` : '';
    ui.walkthroughTitle.replaceChildren(`Walkthrough: attention for ${quoted(tok)}${headName}`);

    const masked = S.masked_scores ? S.masked_scores.values[hd][q] : null;
    const scores = S.scores.values[hd][q];
    const scaled = S.scaled_scores.values[hd][q];
    const weights = S.weights.values[hd][q];
    const context = S.context.values[hd][q];
    const sum = weights.reduce((a, b) => a + b, 0);
    const entropy = doc.stats.entropy[hd][q];
    const maxW = doc.stats.max_weight[hd][q];
    const pe = S.positional_encoding;
    const peOn = cfg.positional_encoding === 'sinusoidal';

    const embedNote = rope ? ` one ${cfg.d_model}-dim vector with no position added: RoPE rotates q and k below instead`
      : ` one ${cfg.d_model}-dim ${peOn ? 'position-aware' : 'context-free, position-blind'} vector`;
    const rows = [
      stageRow('input', cross ? 'Embed the sentence' : 'Embed',
        [h('code', { text: peOn ? `E[${tok}] + PE(${q})` : `E[${tok}]` }), h('span', { class: 'op-note', text: embedNote })],
        h('div', { class: 'stack' },
          vecLine('x', 'x =', S.input.values[q]),
          vecLine('E', 'E =', S.token_embedding.values[q], 'vec-line muted-line'),
          peOn && pe ? vecLine('PE', 'PE =', pe.values[q], 'vec-line muted-line') : null)),
    ];
    if (cross && S.context_input) {
      rows.push(stageRow('context_input', 'Embed the context',
        [h('code', { text: peOn ? 'x_ctx = E[c] + PE(c)' : 'x_ctx = E[c]' }),
          h('span', { class: 'op-note', text: ` the keys and values come from these ${keyTokens.length} tokens, with their own positions` })],
        tokenVectors('x_ctx', 'x_ctx', keyTokens, S.context_input.values)));
    }
    const kvNote = gqa
      ? `, with head ${hd}'s own W_Q; K and V from K/V head ${kvh}, shared by query heads `
        + `${cfg.query_heads_of_kv_head[kvh].join(', ')}`
      : cfg.num_heads > 1 ? `, with head ${hd}'s own matrices` : '';
    rows.push(stageRow('project', 'Project',
      [h('code', { text: cross ? 'Q = x·W_Qᵀ, K = x_ctx·W_Kᵀ, V = x_ctx·W_Vᵀ' : 'Q = x·W_Qᵀ, K = x·W_Kᵀ, V = x·W_Vᵀ' }),
        h('span', { class: 'op-note', text: ` each ${cfg.d_k}-dim${kvNote}` })],
      cross
        ? h('div', { class: 'stack' },
          vecLine('q', `Q_${tok} =`, S.q.values[hd][q]),
          tokenVectors('k', 'K', keyTokens, S.k.values[kvh]),
          tokenVectors('v', 'V', keyTokens, S.v.values[kvh]))
        : h('div', { class: 'stack' },
          vecLine('q', `Q_${tok} =`, S.q.values[hd][q]),
          vecLine('k', `K_${tok} =`, S.k.values[kvh][q]),
          vecLine('v', `V_${tok} =`, S.v.values[kvh][q]))));
    if (rope && S.q_rotated && S.k_rotated) {
      const pairing = cfg.rope_pairing === 'interleaved'
        ? 'interleaved: pairs (2j, 2j + 1), as in RoFormer' : 'rotate-half: pairs (j, j + d_k/2), as in Llama and GPT-NeoX';
      rows.push(stageRow('rotate', h('span', {}, 'Rotate ', h('abbr', { title: 'rotary position embedding', text: 'RoPE' })),
        h('span', {}, 'turn each pair of coordinates by ', h('code', { text: `θⱼ = ${q}·${fmtBase(cfg.rope_base)}^(−2j/${cfg.d_k})` }),
          h('span', { class: 'op-note', text: ` (position ${q}; ${pairing}). V is not rotated.` })),
        h('div', { class: 'stack' },
          vecLine('q_before', `Q_${tok} =`, S.q.values[hd][q], 'vec-line muted-line'),
          vecLine('q_rotated', `RoPE(Q_${tok}) =`, S.q_rotated.values[hd][q]),
          vecLine('k_before', `K_${tok} =`, S.k.values[kvh][q], 'vec-line muted-line'),
          vecLine('k_rotated', `RoPE(K_${tok}) =`, S.k_rotated.values[kvh][q]),
          h('p', { class: 'hint', text: 'A rotation keeps each vector\'s length; the score of a rotated query and key depends '
            + 'on their positions only through the offset between them.' }))));
    }
    const qName = rope ? `RoPE(Q)_${tok}` : `Q_${tok}`;
    const kName = rope ? 'RoPE(K)_j' : 'K_j';
    rows.push(
      stageRow('scores', h('span', {}, 'Score ', h('code', { text: 'QKᵀ' })),
        h('code', { text: `${qName} · ${kName} for each ${cross ? 'context ' : ''}key j` }),
        keyList('scores', keyTokens, scores, (v) => h('span', { class: 'num', text: fmt(v, 4) }))),
      stageRow('scaled_scores', h('span', {}, 'Scale ', h('code', { text: cfg.scale ? `/√${cfg.d_k}` : '/1' })),
        cfg.scale
          ? h('span', {}, 'divide each by ', h('code', { text: `√${cfg.d_k}` }), ` = ${fmt(cfg.scale_factor, 4)}`)
          : h('span', {}, 'scaling off: divide by 1 (the raw scores go to softmax)'),
        keyList('scaled_scores', keyTokens, scaled, (v) => h('span', { class: 'num', text: fmt(v, 4) }))),
    );
    if (masked) {
      const what = cfg.window !== undefined
        ? h('span', {}, `keys after ${quoted(tok)}, and keys ${cfg.window} or more positions before it, are set to `,
          h('code', { text: '−∞' }), `: a sliding window of ${cfg.window}, so a token sees itself and at most `
            + `${cfg.window - 1} earlier token${cfg.window - 1 === 1 ? '' : 's'}`)
        : h('span', {}, `keys after ${quoted(tok)} are set to `, h('code', { text: '−∞' }), ': a token sees only itself and earlier tokens');
      rows.push(stageRow('masked_scores', 'Mask', what,
        keyList('masked_scores', keyTokens, masked, (v, m) => h('span', { class: 'num', text: m ? 'masked (−∞)' : fmt(v, 4) }))));
    }
    rows.push(
      stageRow('weights', 'Softmax %',
        h('span', {}, h('code', { text: 'exp(s_j) / Σ exp(s)' }), ' over the row'),
        h('div', { class: 'stack' },
          keyList('weights', keyTokens, weights.map((v, j) => (masked && masked[j] === null ? null : v)),
            (v, m) => (m
              ? h('span', { class: 'num', text: 'masked (0%)' })
              : h('span', { class: 'num' }, h('span', { class: 'pct', text: pct(v) }),
                h('span', { class: 'frac', text: ` (${fmt(v, 4)})` })))),
          h('p', { class: 'wt-check' },
            h('span', { data: { check: 'sum' } }, `Σ = ${fmt(sum, 4)}`), ' · ',
            h('span', { data: { check: 'entropy' } }, `entropy ${fmt(entropy, 3)} nats`), ' · ',
            h('span', { data: { check: 'max' } }, `max ${pct(maxW)}`)))),
      stageRow('context', 'Weight V',
        h('span', {}, h('code', { text: 'Σ_j w_j · V_j' }), cross ? ' the blend of the context\'s value vectors' : ' the blend of value vectors'),
        h('div', { class: 'vec-line', data: { part: 'context' } }, h('span', { class: 'vec-name', text: 'context ≈' }), vec(context))),
      stageRow('concat', 'Concat',
        h('span', {}, h('code', { text: `[head₀ | … | head_${cfg.num_heads - 1}]` }), ` ${cfg.num_heads} × ${cfg.d_k} = ${cfg.num_heads * cfg.d_k} values`),
        h('div', { class: 'vec-line', data: { part: 'concat' } }, vec(S.concat.values[q]))),
      stageRow('output', h('span', {}, sub('O', 'W')),
        h('span', {}, h('code', { text: 'concat · W_Oᵀ' }), ` mixes the heads back into d_model = ${cfg.d_model}`),
        h('div', { class: 'vec-line', data: { part: 'output' } }, h('span', { class: 'vec-name', text: 'output =' }), vec(S.output.values[q]))),
    );

    const table = h('table', { class: 'walkthrough-table' },
      h('caption', { class: 'visually-hidden', text: `Stages of attention for query ${quoted(tok)}` }),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col', text: 'Stage' }), h('th', { scope: 'col', text: 'Operation' }),
        h('th', { scope: 'col', text: `Result for query ${quoted(tok)}` }))),
      h('tbody', {}, rows));
    ui.walkthrough.replaceChildren(h('div', { class: 'table-scroll' }, table),
      explainWeights(tokens, keyTokens, q, weights, masked, cross));
  }

  const fmtBase = (base) => String(base); // JSON's 10000.0 prints as 10000

  function explainWeights(tokens, keyTokens, q, weights, masked, cross) {
    const order = weights.map((w, j) => j).filter((j) => !(masked && masked[j] === null)).sort((a, b) => weights[b] - weights[a]);
    const top = order[0];
    const parts = [];
    if (cross) {
      parts.push(`${quoted(tokens[q].text)} takes the most, ${pct(weights[top])}, from the context's ${quoted(keyTokens[top].text)}`);
      const rest = order.filter((j) => j !== top);
      if (rest.length && rest.length <= 4) {
        parts.push(`; it mixes in ${rest.map((j) => `${pct(weights[j])} of ${quoted(keyTokens[j].text)}`).join(', ')}`);
      }
    } else {
      parts.push(`${quoted(tokens[q].text)} keeps `);
      if (top === q) {
        parts.push(`${pct(weights[q])} of its own value`);
      } else {
        parts.push(`${pct(weights[q])} of its own value and takes the most, ${pct(weights[top])}, from ${quoted(tokens[top].text)}`);
      }
      const rest = order.filter((j) => j !== q && j !== top);
      if (rest.length && rest.length <= 4) {
        parts.push(`; it mixes in ${rest.map((j) => `${pct(weights[j])} of ${quoted(tokens[j].text)}`).join(', ')}`);
      }
    }
    parts.push('. With random, untrained weights this pattern is an artefact of the initialisation, not understanding.');
    return h('p', { class: 'explain' }, parts.join(''));
  }

  // -- heatmaps

  function heatmap(spec) {
    const { stage, title, formula, matrix, tokens, range, kind, maskRow } = spec;
    const keyTokens = spec.keyTokens || tokens;
    const n = Math.min(matrix.length, HEATMAP_MAX_TOKENS);
    const m = Math.min(matrix[0]?.length ?? 0, HEATMAP_MAX_TOKENS);
    const compact = Math.max(n, m) > CELL_NUMBERS_MAX_TOKENS;
    const labels = tokens.slice(0, n).map((t) => t.text);
    const keyLabels = keyTokens.slice(0, m).map((t) => t.text);
    const keyWord = spec.keyTokens ? 'context key' : 'key';
    const valueText = (v) => (kind === 'weight' ? `${fmt(v, 4)} (${pct(v, 2)})` : fmt(v, 4));
    const head = h('tr', {}, h('th', { class: 'hm-corner', scope: 'col' }, h('span', { class: 'visually-hidden', text: `query \\ ${keyWord}` })),
      keyLabels.map((l, j) => h('th', { scope: 'col', class: 'hm-col', title: `${keyWord} ${j}: ${l}` }, h('span', { class: 'hm-label', text: l }))));
    const body = [];
    const ex = state.explain && state.explain.head === state.head ? state.explain : null;
    for (let i = 0; i < n; i += 1) {
      const cells = [];
      for (let j = 0; j < m; j += 1) {
        const v = matrix[i][j];
        const isMasked = v === null || (maskRow && maskRow(i, j));
        const explained = ex !== null && ex.query === i && ex.key === j;
        const label = (isMasked
          ? `${title}: query ${quoted(labels[i])} → ${keyWord} ${quoted(keyLabels[j])}: masked${kind === 'weight' ? ' (weight 0)' : ' (−∞)'}`
          : `${title}: query ${quoted(labels[i])} → ${keyWord} ${quoted(keyLabels[j])}: ${valueText(v)}`)
          + (explained ? ' (explained below)' : '');
        const td = h('td', {
          class: `hm-cell${isMasked ? ' is-masked' : ''}${explained ? ' is-explained' : ''}`, tabindex: -1, title: label,
          'aria-label': label,
          data: { row: i, col: j, value: v === null ? 'null' : String(v) },
        }, compact ? '' : (isMasked ? '—' : fmt(v, 2)));
        if (!isMasked) shade(td, unit(v, range));
        cells.push(td);
      }
      body.push(h('tr', { class: i === state.query ? 'is-query' : null, data: { row: i } },
        h('th', { scope: 'row', class: 'hm-row', title: `query ${i}: ${labels[i]}` },
          h('span', { class: 'hm-label', text: labels[i] })), cells));
    }
    const table = h('table', {
      class: `hm-grid${compact ? ' is-compact' : ''}`, role: 'grid',
      'aria-label': `${title}, head ${state.head}: rows are queries, columns are ${spec.keyTokens ? 'the context\'s keys' : 'keys'}`,
      data: { stage },
    }, h('thead', {}, head), h('tbody', {}, body));
    // Roving tabindex: one tab stop per grid, arrows move inside it.
    const start = table.querySelector(`td[data-row="${Math.min(state.query, n - 1)}"][data-col="0"]`);
    if (start) start.tabIndex = 0;
    table.addEventListener('keydown', gridKeys);
    table.addEventListener('focusin', (e) => readCell(e.target));
    table.addEventListener('mouseover', (e) => readCell(e.target));
    table.addEventListener('click', (e) => {
      const cell = e.target.closest('td.hm-cell, th.hm-row');
      if (!cell) return;
      const row = Number(cell.dataset.row ?? cell.parentElement.dataset.row);
      if (cell.matches('td')) activateCell(stage, row, Number(cell.dataset.col));
      else if (row !== state.query) select(row, null, { focus: () => focusCell(stage, row, 0) });
    });
    return h('figure', { class: 'heatmap', data: { stage } },
      h('figcaption', {}, h('span', { class: 'hm-title', text: title }), ' ', h('code', { class: 'hm-formula', text: formula })),
      h('div', { class: 'hm-scroll' }, table),
      h('div', { class: 'legend-row' }, legend(range, kind, spec.showMasked),
        h('button', {
          type: 'button', class: 'button button-small', data: { svg: stage },
          'aria-label': `Download the ${title.toLowerCase()} map of head ${state.head} as SVG`,
          onclick: () => downloadSvg(heatmapSvg(spec), `${exportName()}_${stage}_head${state.head}.svg`),
        }, 'Download SVG')));
  }

  /** A cell clicked, or Enter on it: its row's token becomes the query, and the service explains the cell. */
  function activateCell(stage, row, col) {
    explainCell(state.head, row, col);
    select(row, null, { focus: () => focusCell(stage, row, col) });
  }

  function legend(range, kind, showMasked) {
    const lo = kind === 'weight' ? '0%' : fmt(range[0], 2);
    const hi = kind === 'weight' ? '100%' : fmt(range[1], 2);
    return h('div', { class: 'legend' },
      h('span', { class: 'legend-end', text: lo }),
      h('span', { class: 'legend-bar', role: 'img', 'aria-label': `colour scale from ${lo} (light) to ${hi} (dark)` }),
      h('span', { class: 'legend-end', text: hi }),
      showMasked ? h('span', { class: 'legend-masked' }, h('span', { class: 'swatch is-masked', 'aria-hidden': 'true' }), 'masked') : null);
  }

  function readCell(target) {
    const cell = target.closest && target.closest('td.hm-cell');
    if (!cell) return;
    ui.readout.textContent = cell.getAttribute('aria-label');
  }

  function focusCell(stage, row, col) {
    const cell = ui.maps.querySelector(`table[data-stage="${stage}"] td[data-row="${row}"][data-col="${col}"]`);
    if (cell) {
      for (const c of cell.closest('table').querySelectorAll('td[tabindex="0"]')) c.tabIndex = -1;
      cell.tabIndex = 0;
      cell.focus();
    }
  }

  function gridKeys(e) {
    const cell = e.target.closest('td.hm-cell');
    if (!cell) return;
    const table = cell.closest('table');
    const n = table.tBodies[0].rows.length;
    const m = table.tBodies[0].rows[0].cells.length - 1; // minus the row label
    let row = Number(cell.dataset.row);
    let col = Number(cell.dataset.col);
    switch (e.key) {
      case 'ArrowRight': col = Math.min(m - 1, col + 1); break;
      case 'ArrowLeft': col = Math.max(0, col - 1); break;
      case 'ArrowDown': row = Math.min(n - 1, row + 1); break;
      case 'ArrowUp': row = Math.max(0, row - 1); break;
      case 'Home': col = 0; if (e.ctrlKey) row = 0; break;
      case 'End': col = m - 1; if (e.ctrlKey) row = n - 1; break;
      case 'Enter':
      case ' ':
        e.preventDefault();
        activateCell(table.dataset.stage, row, col);
        return;
      default: return;
    }
    e.preventDefault();
    focusCell(table.dataset.stage, row, col);
  }

  function renderMaps() {
    const { doc } = state.main;
    const S = doc.stages;
    const cfg = doc.config;
    const hd = state.head;
    const tokens = doc.tokens;
    // Cross-attention: the context's tokens label the key axis of every map.
    const keyTokens = isCross(doc) ? doc.context_tokens : undefined;
    const masked = S.masked_scores;
    const isMasked = masked ? (i, j) => masked.values[hd][i][j] === null : null;
    const rope = cfg.positional_encoding === 'rope';
    const qk = rope ? 'RoPE(Q)RoPE(K)ᵀ' : 'QKᵀ';
    const crossNote = keyTokens ? ' · keys: the context' : '';
    ui.mapsTitle.replaceChildren(`Attention maps${cfg.num_heads > 1 ? ` · head ${hd} of ${cfg.num_heads}` : ''}${crossNote}`);
    const maps = [
      heatmap({ stage: 'scores', title: 'Scores', formula: qk, matrix: S.scores.values[hd], tokens, keyTokens,
        range: extent(S.scores.values[hd]), kind: 'score' }),
      heatmap({ stage: 'scaled_scores', title: 'Scaled scores', formula: cfg.scale ? `${qk}/√${cfg.d_k}` : `${qk}/1 (scaling off)`,
        matrix: S.scaled_scores.values[hd], tokens, keyTokens, range: extent(S.scaled_scores.values[hd]), kind: 'score' }),
    ];
    if (masked) {
      const formula = cfg.window !== undefined ? `future keys and keys ≥ ${cfg.window} back → −∞` : 'future keys → −∞';
      maps.push(heatmap({ stage: 'masked_scores', title: cfg.window !== undefined ? 'Masked scores (sliding window)' : 'Masked scores',
        formula, matrix: masked.values[hd], tokens, keyTokens, range: extent(masked.values[hd]), kind: 'score', showMasked: true }));
    }
    maps.push(heatmap({ stage: 'weights', title: 'Weights', formula: 'softmax: rows sum to 1', matrix: S.weights.values[hd],
      tokens, keyTokens, range: [0, 1], kind: 'weight', maskRow: isMasked, showMasked: !!masked }));
    const longest = Math.max(tokens.length, (keyTokens || tokens).length);
    const note = longest > HEATMAP_MAX_TOKENS
      ? h('p', { class: 'hint', text: `Showing the first ${HEATMAP_MAX_TOKENS} of ${longest} tokens; download the JSON for all of them.` })
      : null;
    // Columns as wide as one map needs: about 3.6em a cell plus the row labels.
    const n = Math.min((keyTokens || tokens).length, HEATMAP_MAX_TOKENS);
    const perCell = n > CELL_NUMBERS_MAX_TOKENS ? 1.05 : 2.8;
    const grid = h('div', { class: 'heatmaps', vars: { '--hm-min': `${Math.max(14, n * perCell + 5).toFixed(2)}em` } }, maps);
    ui.maps.replaceChildren(...[grid, note].filter(Boolean));
    renderThumbs();
  }

  function renderThumbs() {
    const { doc } = state.main;
    const cfg = doc.config;
    const W = doc.stages.weights.values;
    const n = Math.min(doc.tokens.length, HEATMAP_MAX_TOKENS);
    const keyTokens = keyTokensOf(doc);
    const nk = Math.min(keyTokens.length, HEATMAP_MAX_TOKENS);
    if (cfg.num_heads === 1) {
      ui.thumbs.replaceChildren(h('p', { class: 'hint' },
        'One head. Move the head slider (try 4 heads at d_model 24) to see each head attend differently.'));
      return;
    }
    if (cfg.num_heads * n * nk > THUMBS_MAX_CELLS) {
      ui.thumbs.replaceChildren(h('p', { class: 'hint', text: 'Too many heads × tokens to draw every head; pick a head above.' }));
      return;
    }
    const masked = doc.stages.masked_scores;
    const thumbs = W.map((m, hi) => {
      const grid = h('span', { class: 'thumb-grid', vars: { '--n': String(nk) }, 'aria-hidden': 'true' });
      for (let i = 0; i < n; i += 1) {
        for (let j = 0; j < nk; j += 1) {
          const off = masked && masked.values[hi][i][j] === null;
          const c = h('span', { class: `thumb-cell${off ? ' is-masked' : ''}${i === state.query ? ' is-query' : ''}` });
          if (!off) shade(c, m[i][j]);
          grid.append(c);
        }
      }
      const row = m[state.query];
      const top = row.indexOf(Math.max(...row));
      const kv = cfg.query_heads_of_kv_head ? ` · K/V ${kvHeadOf(cfg, hi)}` : '';
      return h('button', {
        type: 'button', class: 'thumb', 'aria-pressed': hi === state.head ? 'true' : 'false',
        'aria-label': `Head ${hi}${kv ? ` (reads K/V head ${kvHeadOf(cfg, hi)})` : ''}: ${quoted(doc.tokens[state.query].text)} `
          + `attends most to ${quoted(keyTokens[top].text)} (${pct(row[top])})`,
        onclick: () => select(null, hi),
      }, grid, h('span', { class: 'thumb-caption' }, `head ${hi}${kv}`, h('span', { class: 'thumb-top', text: `${keyTokens[top].text} ${pct(row[top], 0)}` })));
    });
    ui.thumbs.replaceChildren(
      h('h3', { class: 'subhead', text: 'Every head\'s weights' }),
      h('p', { class: 'hint', text: 'Same sentence, different projections, different soft distributions. Pick a head to inspect it.' }),
      h('div', { class: 'thumbs' }, thumbs));
  }

  // -- grouped-query attention

  function renderKv() {
    const cfg = state.main.doc.config;
    if (cfg.num_kv_heads === undefined) {
      ui.kvSection.hidden = true;
      ui.kvBody.replaceChildren();
      return;
    }
    ui.kvSection.hidden = false;
    const groups = cfg.query_heads_of_kv_head;
    const kvh = kvHeadOf(cfg, state.head);
    const kind = cfg.num_kv_heads === 1 ? `Multi-query attention (MQA): all ${cfg.num_heads} query heads read one K/V head.`
      : cfg.num_kv_heads === cfg.num_heads ? 'Multi-head attention: every query head has its own K/V head.'
        : `Grouped-query attention (GQA): ${cfg.num_heads} query heads in ${cfg.num_kv_heads} groups of `
          + `${cfg.num_heads / cfg.num_kv_heads}, one K/V head per group.`;
    const table = h('table', { class: 'side-table kv-table' },
      h('caption', { class: 'visually-hidden', text: 'Which query heads share each K/V head' }),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col', text: 'K/V head' }), h('th', { scope: 'col', text: 'read by query heads' }))),
      h('tbody', {}, groups.map((heads, j) => h('tr', { data: { kvHead: j }, class: j === kvh ? 'is-query' : null },
        h('th', { scope: 'row', text: `K/V ${j}` }),
        h('td', { class: 'num', text: heads.join(', ') })))));
    const bytes = cfg.kv_cache_bytes_per_token || {};
    const ratio = cfg.num_heads / cfg.num_kv_heads;
    const facts = h('dl', { class: 'facts kv-bytes' },
      Object.entries(bytes).map(([dtype, b]) => h('div', { data: { dtype } },
        h('dt', {}, `KV cache per token, ${dtype}`), h('dd', { text: `${int(b)} B` }))));
    ui.kvBody.replaceChildren(
      h('p', { class: 'explain kv-kind', text: kind }),
      h('div', { class: 'saturation-layout' },
        h('div', { class: 'table-scroll' }, table),
        h('div', {},
          facts,
          h('p', { class: 'hint', text: `K and V for ${cfg.num_kv_heads} head${cfg.num_kv_heads === 1 ? '' : 's'} of d_k ${cfg.d_k}, `
            + 'per token and per layer, from the service\'s config.'
            + (ratio > 1 ? ` Multi-head attention would keep ${ratio}× as much.` : '') }))));
  }

  // -- KV-cache decoding

  function renderDecode() {
    const { doc } = state.main;
    const cfg = doc.config;
    const steps = Array.isArray(doc.decode) ? doc.decode : null;
    if (!steps || !steps.length) {
      ui.decodeSection.hidden = true;
      ui.decodeBody.replaceChildren();
      return;
    }
    ui.decodeSection.hidden = false;
    const last = steps.length - 1;
    const t = state.step === null ? last : Math.min(Math.max(state.step, 0), last);
    const st = steps[t];
    const hd = state.head;
    const kvh = kvHeadOf(cfg, hd);
    const cache = st.cache_positions;
    const rope = Array.isArray(st.q_rotated);
    ui.decodeStep.max = String(last);
    ui.decodeStep.value = String(t);
    ui.decodeStepValue.value = String(t);
    ui.decodeStepValue.textContent = String(t);
    ui.decodeStep.setAttribute('aria-valuetext',
      `step ${t} of ${last}: ${quoted(st.token)}, ${cache.length} cached token${cache.length === 1 ? '' : 's'}`);

    const roleText = { new: 'new', cached: 'cached', evicted: 'out of window', future: 'not yet' };
    const strip = h('ol', { class: 'cache-strip', 'aria-label': `The sequence at step ${t}` }, doc.tokens.map((tk, i) => {
      const role = i === st.position ? 'new' : cache.includes(i) ? 'cached' : i < st.position ? 'evicted' : 'future';
      return h('li', { class: `cache-tok is-${role}`, data: { pos: i, role } },
        h('span', { class: 'cache-text', text: tk.text }), h('span', { class: 'cache-role', text: roleText[role] }));
    }));
    const full = doc.stages.weights.values[hd][st.position];
    const firstRow = Math.max(0, cache.length - HEATMAP_MAX_TOKENS); // long caches: the newest entries only
    const diff = cache.reduce((mx, pos, r) => Math.max(mx, Math.abs(st.weights[hd][r] - full[pos])), 0);
    const table = h('table', { class: 'side-table cache-table' },
      h('caption', { class: 'visually-hidden', text: `The KV cache at step ${t}, read by head ${hd}` }),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col', text: 'cached token' }),
        h('th', { scope: 'col' }, rope ? 'RoPE(k) in k_cache' : 'k_cache'),
        h('th', { scope: 'col', text: 'v_cache' }),
        h('th', { scope: 'col', text: 'scaled score' }),
        h('th', { scope: 'col', text: 'weight' }))),
      h('tbody', {}, cache.map((pos, r) => (r < firstRow ? null : h('tr', { data: { pos }, class: pos === st.position ? 'is-query' : null },
        h('th', { scope: 'row' }, doc.tokens[pos].text, h('span', { class: 'row-note', text: `position ${pos}${pos === st.position ? ', new' : ''}` })),
        h('td', { data: { col: 'k' } }, vec(st.k_cache[kvh][r], 3, 4)),
        h('td', { data: { col: 'v' } }, vec(st.v_cache[kvh][r], 3, 4)),
        h('td', { class: 'num', data: { col: 'score' }, text: fmt(st.scaled_scores[hd][r], 4) }),
        h('td', { class: 'num', data: { col: 'weight' }, text: pct(st.weights[hd][r]) }))))));
    const cut = firstRow > 0
      ? h('p', { class: 'hint', text: `Showing the newest ${cache.length - firstRow} of ${cache.length} cache entries; download the JSON for all of them.` })
      : null;
    const bytes = cfg.kv_cache_bytes_per_token;
    const kvName = cfg.num_kv_heads !== undefined ? ` (K/V head ${kvh})` : '';
    ui.decodeBody.replaceChildren(
      strip,
      h('p', { class: 'explain decode-summary' },
        `Step ${t}: ${quoted(st.token)} at position ${st.position}. Its q${rope ? ', rotated,' : ''} attends to the `
        + `${cache.length} cached key${cache.length === 1 ? '' : 's'} and value${cache.length === 1 ? '' : 's'}${kvName}`
        + `${cfg.window !== undefined && cache[0] > 0 ? `; the sliding window of ${cfg.window} has dropped positions before ${cache[0]}` : ''}.`
        + (bytes ? ` The cache now holds ${cache.length} × ${int(bytes.float32)} B = ${int(cache.length * bytes.float32)} B in float32.` : '')),
      h('div', { class: 'stack' },
        vecLine('decode-q', rope ? `RoPE(q)_${st.token} =` : `q_${st.token} =`, rope ? st.q_rotated[hd] : st.q[hd]),
        vecLine('decode-k', `${rope ? 'RoPE(k)' : 'k'}_${st.token} joins the cache:`, rope ? st.k_rotated[kvh] : st.k[kvh])),
      h('div', { class: 'table-scroll' }, table),
      cut,
      h('div', { class: 'stack' },
        vecLine('decode-context', 'context ≈', st.context[hd]),
        vecLine('decode-output', 'output =', st.output)),
      h('p', { class: 'hint', data: { check: 'decode' } },
        `Same weights as row ${st.position} of the full causal trace above (largest difference ${diff.toExponential(1)}): `
        + 'the cache changes the cost, not the numbers.'));
  }

  // -- saturation

  function renderSaturation() {
    const cfg = state.main.doc.config;
    // While the comparison for this trace is on its way, the section keeps its content, marked busy (and dimmed
    // only if that lasts: no flash), and it cannot be downloaded.
    ui.saturationSection.classList.toggle('is-updating', state.altPending);
    ui.saturationSection.setAttribute('aria-busy', String(state.altPending));
    ui.saturationSvg.disabled = state.altPending || !state.alt;
    if (state.altPending) return;
    if (!state.alt) {
      const msg = state.altError ? `The comparison trace failed: ${state.altError.message}`
        : STANDALONE ? 'This saved trace holds no comparison trace.' : 'No comparison trace.';
      ui.saturation.replaceChildren(h('p', { class: 'problem-inline', text: msg }));
      return;
    }
    const scaled = cfg.scale ? state.main.doc : state.alt.doc;
    const unscaled = cfg.scale ? state.alt.doc : state.main.doc;
    const q = state.query;
    const hd = state.head;
    const tokens = scaled.tokens;
    const keyTokens = keyTokensOf(scaled);
    const variants = [
      { id: 'scaled', doc: scaled, name: 'Scaled', note: `÷ √${scaled.config.d_k} = ${fmt(scaled.config.scale_factor, 3)}` },
      { id: 'unscaled', doc: unscaled, name: 'Unscaled', note: '÷ 1' },
    ].map((v) => ({ ...v, w: v.doc.stages.weights.values[hd][q],
      m: v.doc.stages.masked_scores ? v.doc.stages.masked_scores.values[hd][q] : null }));
    // Keys down the side, the two variants side by side: reads at any width and any length.
    const weightCell = (v, j) => {
      const off = v.m && v.m[j] === null;
      const x = v.w[j];
      return h('td', { class: `bar-cell${off ? ' is-masked' : ''}`, data: { variant: v.id, key: j }, title: off ? 'masked' : fmt(x, 6) },
        h('span', { class: 'num', text: off ? 'masked' : pct(x) }),
        h('span', { class: 'bar', vars: { '--w': off ? '0' : x.toFixed(4) }, 'aria-hidden': 'true' }));
    };
    const table = h('table', { class: 'compare-table' },
      h('caption', { class: 'visually-hidden', text: `Weights of ${quoted(tokens[q].text)}, scaled and unscaled` }),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'key', h('span', { class: 'row-note', text: `query ${quoted(tokens[q].text)}` })),
        variants.map((v) => h('th', { scope: 'col', data: { variant: v.id } }, v.name, h('span', { class: 'row-note', text: v.note }))))),
      h('tbody', {},
        keyTokens.map((t, j) => h('tr', { data: { key: j }, class: j === q && !isCross(scaled) ? 'is-query' : null },
          h('th', { scope: 'row', text: t.text }), variants.map((v) => weightCell(v, j)))),
        h('tr', { class: 'stat-row', data: { stat: 'entropy' } },
          h('th', { scope: 'row' }, 'entropy', h('span', { class: 'row-note', text: 'nats, from stats' })),
          variants.map((v) => h('td', { class: 'num', data: { variant: v.id }, text: fmt(v.doc.stats.entropy[hd][q], 3) }))),
        h('tr', { class: 'stat-row', data: { stat: 'max_weight' } },
          h('th', { scope: 'row' }, 'max weight', h('span', { class: 'row-note', text: 'from stats' })),
          variants.map((v) => h('td', { class: 'num', data: { variant: v.id }, text: pct(v.doc.stats.max_weight[hd][q]) })))));
    const visible = (scaled.stages.masked_scores
      ? scaled.stages.masked_scores.values[hd][q].filter((v) => v !== null).length : keyTokens.length);
    const ms = scaled.stats.max_weight[hd][q];
    const mu = unscaled.stats.max_weight[hd][q];
    const es = scaled.stats.entropy[hd][q];
    const eu = unscaled.stats.entropy[hd][q];
    const text = visible <= 1
      ? `${quoted(tokens[q].text)} can see only ${isCross(scaled) ? 'one key' : 'itself'} here, so its single weight is 100% either way.`
      : scaled.config.d_k === 1 ? 'With d_k = 1, √d_k = 1: scaling changes nothing. Raise d_model or lower the head count.'
      : `Without the √d_k divisor the largest weight goes from ${pct(ms)} to ${pct(mu)} and the entropy from ${fmt(es, 3)} to `
        + `${fmt(eu, 3)} nats (a uniform row over ${visible} keys would be ln ${visible} = ${fmt(Math.log(visible), 3)}). `
        + 'Large dot products saturate softmax towards one-hot, and the other tokens get almost no gradient; the wider d_k, '
        + 'the larger the raw scores, which is why the divisor is √d_k.';
    ui.saturation.replaceChildren(h('div', { class: 'saturation-layout' },
      h('div', { class: 'table-scroll' }, table), h('p', { class: 'explain', text })));
  }

  // -- concat vs average

  function strip(values, range, { digits = 3, label, group, className = '' } = {}) {
    const compact = values.length > VECTOR_NUMBERS_MAX;
    return h('span', { class: `strip${compact ? ' is-compact' : ''} ${className}`, role: 'list', 'aria-label': label },
      values.map((v, i) => shade(h('span', {
        class: 'strip-cell', role: 'listitem', title: `${label} [${i}] = ${fmt(v, 4)}`, data: { i, group },
      }, compact ? '' : fmt(v, digits)), unit(v, range))));
  }

  function renderMultihead() {
    const { doc } = state.main;
    const cfg = doc.config;
    const q = state.query;
    const tok = doc.tokens[q].text;
    const heads = doc.stages.context.values.map((m) => m[q]);
    const concat = doc.stages.concat.values[q];
    const output = doc.stages.output.values[q];
    const avg = heads[0].map((_, d) => heads.reduce((s, hv) => s + hv[d], 0) / heads.length);
    const range = extent([heads, concat, avg]);
    const headRows = heads.map((hv, i) => h('div', { class: `mh-row${i === state.head ? ' is-selected' : ''}`, data: { head: i } },
      h('span', { class: 'mh-label' }, `head ${i}`, h('span', { class: 'row-note', text: `length ${fmt(norm(hv), 2)}` })),
      strip(hv, range, { label: `head ${i} output for ${tok}`, className: 'strip-head' })));
    const concatGroups = heads.map((hv, i) => h('span', { class: 'concat-group', data: { head: i } },
      h('span', { class: 'concat-group-label', text: `h${i}` }),
      strip(concat.slice(i * cfg.d_k, (i + 1) * cfg.d_k), range, { label: `concat, head ${i}'s slots`, group: i })));
    const meanNorm = heads.reduce((s, hv) => s + norm(hv), 0) / heads.length;
    const kids = [
      h('div', { class: 'mh-block' },
        h('h3', { class: 'subhead' }, `Each head's output for ${quoted(tok)}`, h('span', { class: 'muted', text: ` (${cfg.num_heads} × d_k ${cfg.d_k})` })),
        h('div', { class: 'mh-heads' }, headRows)),
      h('div', { class: 'mh-block', data: { part: 'concat' } },
        h('h3', { class: 'subhead' }, 'Concatenated', h('span', { class: 'muted', text: ` (${cfg.num_heads} × ${cfg.d_k} = ${concat.length} = d_model)` })),
        h('div', { class: 'concat' }, concatGroups),
        h('p', { class: 'hint', text: 'Nothing is lost: each head keeps its own slots.' })),
      h('div', { class: 'mh-block mh-contrast', data: { part: 'average' } },
        h('h3', { class: 'subhead' }, 'Averaged, for contrast', h('span', { class: 'muted', text: ` (only ${cfg.d_k} values)` })),
        strip(avg, range, { label: `average of the heads for ${tok}` }),
        h('p', { class: 'hint', text: cfg.num_heads === 1
          ? 'With one head the average is that head: add heads to see them cancel.'
          : `The average has length ${fmt(norm(avg), 2)}, against ${fmt(meanNorm, 2)} for a typical head: where heads `
            + `disagree their signals cancel, and ${cfg.num_heads} perspectives are squeezed into one ${cfg.d_k}-value slot. `
            + 'Transformers concatenate instead.' })),
      h('div', { class: 'mh-block', data: { part: 'output' } },
        h('h3', { class: 'subhead' }, 'Then ', sub('O', 'W'), h('span', { class: 'muted', text: ` mixes the heads: output = concat·W_Oᵀ (d_model ${cfg.d_model})` })),
        strip(output, extent(output), { label: `output for ${tok}` })),
    ];
    ui.multihead.replaceChildren(...kids);
  }

  // ------------------------------------------------------------------ actions

  function curlFor(body) {
    // A saved page does not know where the service runs: the shell fills it in.
    const url = STANDALONE ? '"$ATTENTION_TRACE_URL/trace"' : shellQuote(new URL('trace', location.href).href);
    return `curl -s ${url} -H 'content-type: application/json' -d ${shellQuote(JSON.stringify(body))}`;
  }

  function renderCurl(body) {
    ui.curl.textContent = curlFor(body);
  }

  async function copyCurl() {
    const text = ui.curl.textContent;
    try {
      if (!navigator.clipboard || !window.isSecureContext) throw new Error('no clipboard');
      await navigator.clipboard.writeText(text);
      ui.actionStatus.textContent = 'Copied the curl command to the clipboard.';
    } catch {
      const details = ui.curl.closest('details');
      details.open = true;
      const range = document.createRange();
      range.selectNodeContents(ui.curl);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      ui.curl.focus();
      ui.actionStatus.textContent = 'The browser did not allow copying: the command is selected below, press Ctrl+C (⌘C).';
    }
  }

  /** The file name of an export of the trace on screen (service/standalone.py names the HTML file alike). */
  function exportName() {
    const { doc, body } = state.main;
    const cfg = doc.config;
    const text = typeof body.sentence === 'string' ? body.sentence : doc.tokens.map((t) => t.text).join(' ');
    const slug = text.trim().toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '').slice(0, 40) || 'trace';
    const variant = [cfg.positional_encoding === 'rope' ? '_rope' : '', cfg.num_kv_heads !== undefined ? `_kv${cfg.num_kv_heads}` : '',
      cfg.window !== undefined ? `_w${cfg.window}` : '', isCross(doc) ? '_cross' : '', cfg.decode ? '_decode' : ''].join('');
    return `attention-trace_${slug}_d${cfg.d_model}_h${cfg.num_heads}_seed${cfg.seed}${cfg.scale ? '' : '_unscaled'}`
      + `${cfg.causal ? '_causal' : ''}${variant}`;
  }

  /** Save a Blob under a name, through a temporary link (no server round trip). */
  function saveBlob(blob, name) {
    const url = URL.createObjectURL(blob);
    const a = h('a', { href: url, download: name, class: 'visually-hidden' });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  function downloadJson() {
    if (!state.main) return;
    const name = `${exportName()}.json`;
    saveBlob(new Blob([state.main.text], { type: 'application/json' }), name);
    ui.actionStatus.textContent = `Saved ${name} (the exact response, every float in full).`;
  }

  /** The service's one-file offline page of the trace on screen (POST /trace/html). */
  async function downloadHtml() {
    if (!state.main || STANDALONE) return;
    ui.downloadHtml.disabled = true;
    ui.actionStatus.textContent = 'Making the HTML file…';
    try {
      const res = await ENDPOINTS.html({
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'text/html, application/problem+json' },
        body: JSON.stringify(state.main.body),
      });
      if (!res.ok) {
        const text = await res.text();
        let problem = null;
        try {
          problem = JSON.parse(text);
        } catch {
          problem = null;
        }
        throw new ServiceError(res.status, problem, text);
      }
      const blob = await res.blob();
      const given = /filename="([^"]+)"/.exec(res.headers.get('Content-Disposition') || '');
      const name = given ? given[1] : `${exportName()}.html`;
      saveBlob(blob, name);
      ui.actionStatus.textContent = `Saved ${name}: this view in one file that opens offline.`;
    } catch (err) {
      ui.actionStatus.textContent = `Could not make the HTML file: ${err?.message || err}`;
    } finally {
      ui.downloadHtml.disabled = !state.main;
    }
  }

  // -- SVG exports: built as DOM, serialised, saved; self-contained (no font, image or style sheet)

  function svg(tag, attrs, ...kids) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      node.append(kid instanceof Node ? kid : String(kid));
    }
    return node;
  }

  function downloadSvg(root, name) {
    const text = `<?xml version="1.0" encoding="UTF-8"?>\n${new XMLSerializer().serializeToString(root)}\n`;
    saveBlob(new Blob([text], { type: 'image/svg+xml' }), name);
    ui.actionStatus.textContent = `Saved ${name}.`;
  }

  // The maps' colour scale, as style.css draws it: color-mix(in oklab, --hm-hi t, --hm-lo).
  const HM_LO = [0xf4, 0xf7, 0xfb];
  const HM_HI = [0x0b, 0x2a, 0x55];
  function toOklab(rgb) {
    const [r, g, b] = rgb.map((c) => { const x = c / 255; return x <= 0.04045 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; });
    const l = Math.cbrt(0.4122214708 * r + 0.5363325363 * g + 0.0514459929 * b);
    const m = Math.cbrt(0.2119034982 * r + 0.6806995451 * g + 0.1073969566 * b);
    const s = Math.cbrt(0.0883024619 * r + 0.2817188376 * g + 0.6299787005 * b);
    return [0.2104542553 * l + 0.7936177850 * m - 0.0040720468 * s, 1.9779984951 * l - 2.4285922050 * m + 0.4505937099 * s,
      0.0259040371 * l + 0.7827717662 * m - 0.8086757660 * s];
  }
  function fromOklab([L, A, B]) {
    const l = (L + 0.3963377774 * A + 0.2158037573 * B) ** 3;
    const m = (L - 0.1055613458 * A - 0.0638541728 * B) ** 3;
    const s = (L - 0.0894841775 * A - 1.2914855480 * B) ** 3;
    const lin = [4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s, -1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s,
      -0.0041960863 * l - 0.7034186147 * m + 1.7076147010 * s];
    return lin.map((c) => {
      const x = c <= 0.0031308 ? 12.92 * c : 1.055 * c ** (1 / 2.4) - 0.055;
      return Math.round(Math.min(1, Math.max(0, x)) * 255);
    });
  }
  const LO_LAB = toOklab(HM_LO);
  const HI_LAB = toOklab(HM_HI);
  function scaleColour(t) {
    const rgb = fromOklab(LO_LAB.map((lo, i) => lo + (HI_LAB[i] - lo) * t));
    return `#${rgb.map((c) => c.toString(16).padStart(2, '0')).join('')}`;
  }
  const inkOn = (t) => (t > 0.6 ? '#ffffff' : '#000000'); // as the page: where black and white ink have equal contrast

  /** Title lines of an export: what was traced, and how. */
  function configLines(doc) {
    const cfg = doc.config;
    const extras = [];
    if (cfg.positional_encoding === 'rope') extras.push(`RoPE ${cfg.rope_pairing}, base ${fmtBase(cfg.rope_base)}`);
    else extras.push(`positional encoding ${cfg.positional_encoding}`);
    if (cfg.num_kv_heads !== undefined) extras.push(`${cfg.num_kv_heads} K/V head${cfg.num_kv_heads === 1 ? '' : 's'}`);
    if (cfg.window !== undefined) extras.push(`window ${cfg.window}`);
    if (isCross(doc)) extras.push(`cross-attention to “${doc.context_tokens.map((t) => t.text).join(' ')}”`);
    return [`“${doc.tokens.map((t) => t.text).join(' ')}”`,
      [`d_model ${cfg.d_model}`, `${cfg.num_heads} head${cfg.num_heads === 1 ? '' : 's'} of d_k ${cfg.d_k}`, `seed ${cfg.seed}`,
        cfg.scale ? `scaled ÷ √${cfg.d_k}` : 'not scaled (÷ 1)', cfg.causal ? 'causal' : null, ...extras,
        `engine ${doc.engine_version}`].filter(Boolean).join(' · ')];
  }

  const SVG_FONT = 'system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, Arial, sans-serif';
  const textWidth = (s, size = 12) => [...s].length * size * 0.62; // generous: no font is embedded

  function svgRoot(width, height, title, desc) {
    return svg('svg', { xmlns: SVG_NS, width: Math.ceil(width), height: Math.ceil(height),
      viewBox: `0 0 ${Math.ceil(width)} ${Math.ceil(height)}`, 'font-family': SVG_FONT, 'font-size': 12, role: 'img' },
    svg('title', {}, title), svg('desc', {}, desc),
    svg('rect', { x: 0, y: 0, width: '100%', height: '100%', fill: '#ffffff' }));
  }

  function hatch() {
    return svg('pattern', { id: 'masked', width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
      svg('rect', { width: 6, height: 6, fill: '#ffffff' }), svg('rect', { width: 2, height: 6, fill: '#b8bfca' }));
  }

  /** One attention map as a stand-alone SVG: title and configuration, both token axes, every cell's number, legend. */
  function heatmapSvg(spec) {
    const { doc } = state.main;
    const { stage, title, formula, matrix, tokens, range, kind, maskRow } = spec;
    const keyTokens = spec.keyTokens || tokens;
    const n = Math.min(matrix.length, HEATMAP_MAX_TOKENS);
    const m = Math.min(matrix[0]?.length ?? 0, HEATMAP_MAX_TOKENS);
    const numbers = Math.max(n, m) <= CELL_NUMBERS_MAX_TOKENS;
    const cw = numbers ? 60 : 16;
    const ch = numbers ? 32 : 16;
    const rows = tokens.slice(0, n).map((t) => t.text);
    const cols = keyTokens.slice(0, m).map((t) => t.text);
    const keyWord = spec.keyTokens ? 'context key' : 'key';
    const heading = `${title} · head ${state.head} of ${doc.config.num_heads} · ${formula}`;
    const lines = [heading, ...configLines(doc)];
    const rowW = Math.min(180, Math.max(40, ...rows.map((r) => textWidth(r)))) + 12;
    const colH = Math.min(140, Math.max(30, ...cols.map((c) => textWidth(c) * 0.71))) + 14;
    const left = 24 + 22 + rowW;
    const top = 20 + lines.length * 18 + 22 + colH;
    const gridW = m * cw;
    const gridH = n * ch;
    const width = Math.max(left + gridW + 24, 48 + Math.max(...lines.map((l, i) => textWidth(l, i ? 12 : 14))), 380);
    const height = top + gridH + 84;
    const root = svgRoot(width, height, `${title}, head ${state.head}: attention-trace`,
      `${lines.join('. ')}. Rows are queries, columns are ${keyWord}s; masked cells are hatched and labelled.`);
    const stops = Array.from({ length: 11 }, (_, i) => svg('stop', { offset: `${i * 10}%`, 'stop-color': scaleColour(i / 10) }));
    root.append(svg('defs', {}, hatch(), svg('linearGradient', { id: 'scale', x1: 0, x2: 1, y1: 0, y2: 0 }, stops)));
    lines.forEach((l, i) => root.append(svg('text', { x: 24, y: 28 + i * 18, 'font-size': i ? 12 : 14,
      'font-weight': i ? 400 : 700, fill: i ? '#444b57' : '#16191f' }, l)));
    root.append(svg('text', { x: left + gridW / 2, y: 20 + lines.length * 18 + 14, 'text-anchor': 'middle', fill: '#444b57' },
      `${keyWord} →`));
    root.append(svg('text', { x: 0, y: 0, 'text-anchor': 'middle', fill: '#444b57',
      transform: `translate(${24 + 8} ${top + gridH / 2}) rotate(-90)` }, 'query →'));
    const colLabels = svg('g', { class: 'col-labels', 'font-weight': 600 });
    cols.forEach((c, j) => colLabels.append(svg('text', { x: 0, y: 0, 'data-col': j,
      transform: `translate(${left + j * cw + cw / 2 + 4} ${top - 6}) rotate(-45)` }, c)));
    const rowLabels = svg('g', { class: 'row-labels', 'font-weight': 600, 'text-anchor': 'end' });
    rows.forEach((r, i) => rowLabels.append(svg('text', { x: left - 8, y: top + i * ch + ch / 2 + 4, 'data-row': i }, r)));
    const cells = svg('g', { class: 'cells', 'text-anchor': 'middle', 'font-size': 11 });
    for (let i = 0; i < n; i += 1) {
      for (let j = 0; j < m; j += 1) {
        const v = matrix[i][j];
        const off = v === null || (maskRow && maskRow(i, j));
        const x = left + j * cw;
        const y = top + i * ch;
        const t = off ? 0 : unit(v, range);
        const exact = off ? 'masked' : kind === 'weight' ? `${fmt(v, 4)} (${pct(v, 2)})` : fmt(v, 4);
        cells.append(svg('g', { 'data-row': i, 'data-col': j, 'data-value': v === null ? 'null' : String(v) },
          svg('title', {}, `query “${rows[i]}” → ${keyWord} “${cols[j]}”: ${exact}`),
          svg('rect', { x: x + 1, y: y + 1, width: cw - 2, height: ch - 2, rx: 2,
            fill: off ? 'url(#masked)' : scaleColour(t), stroke: off ? '#9aa3b2' : 'none' }),
          numbers ? svg('text', { x: x + cw / 2, y: y + ch / 2 + 4, fill: off ? '#444b57' : inkOn(t),
            'font-style': off ? 'italic' : null }, off ? 'masked' : fmt(v, 2)) : null));
      }
    }
    const ly = top + gridH + 30;
    const lo = kind === 'weight' ? '0%' : fmt(range[0], 2);
    const hi = kind === 'weight' ? '100%' : fmt(range[1], 2);
    const barX = 24 + textWidth('colour scale') + 12 + textWidth(lo) + 6;
    const legendG = svg('g', { class: 'legend', fill: '#444b57' },
      svg('text', { x: 24, y: ly + 11 }, 'colour scale'),
      svg('text', { x: barX - 6, y: ly + 11, 'text-anchor': 'end' }, lo),
      svg('rect', { x: barX, y: ly, width: 140, height: 14, fill: 'url(#scale)', stroke: '#d7dbe2' }),
      svg('text', { x: barX + 146, y: ly + 11 }, hi));
    if (spec.showMasked || spec.maskRow) {
      legendG.append(svg('rect', { x: 24, y: ly + 24, width: 18, height: 14, fill: 'url(#masked)', stroke: '#9aa3b2' }),
        svg('text', { x: 48, y: ly + 35 }, kind === 'weight' ? 'masked: excluded from the softmax (weight 0)' : 'masked: set to −∞'));
    }
    root.append(colLabels, rowLabels, cells, legendG);
    return root;
  }

  /** The saturation comparison as SVG: the query's weights, scaled and unscaled, per key; entropy and max weight. */
  function comparisonSvg() {
    const cfg = state.main.doc.config;
    const scaled = cfg.scale ? state.main.doc : state.alt.doc;
    const unscaled = cfg.scale ? state.alt.doc : state.main.doc;
    const q = state.query;
    const hd = state.head;
    const keys = keyTokensOf(scaled).map((t) => t.text);
    const masked = scaled.stages.masked_scores ? scaled.stages.masked_scores.values[hd][q] : null;
    const series = [
      { name: `scaled (÷ √${scaled.config.d_k} = ${fmt(scaled.config.scale_factor, 3)})`, doc: scaled, fill: scaleColour(1) },
      { name: 'unscaled (÷ 1)', doc: unscaled, fill: scaleColour(0.45) },
    ];
    const lines = [`Why divide by √d_k: the weights of “${scaled.tokens[q].text}” (query ${q}), head ${hd}`,
      ...configLines(scaled).map((l) => l.replace(/ · scaled ÷ √\d+| · not scaled \(÷ 1\)/, ''))];
    const labelW = Math.min(180, Math.max(40, ...keys.map((k) => textWidth(k)))) + 12;
    const left = 24 + labelW;
    const barW = 320;
    const rowH = 40;
    const top = 20 + lines.length * 18 + 36;
    const width = Math.max(left + barW + 90, 48 + Math.max(...lines.map((l, i) => textWidth(l, i ? 12 : 14))));
    const height = top + keys.length * rowH + 80;
    const root = svgRoot(width, height, `Scaled and unscaled weights of “${scaled.tokens[q].text}”: attention-trace`,
      `${lines.join('. ')}. For each key, the weight with the scores divided by √d_k and without.`);
    root.append(svg('defs', {}, hatch()));
    lines.forEach((l, i) => root.append(svg('text', { x: 24, y: 28 + i * 18, 'font-size': i ? 12 : 14,
      'font-weight': i ? 400 : 700, fill: i ? '#444b57' : '#16191f' }, l)));
    const legendY = 20 + lines.length * 18 + 10;
    series.forEach((s, k) => root.append(svg('rect', { x: 24 + k * 220, y: legendY, width: 14, height: 12, fill: s.fill }),
      svg('text', { x: 44 + k * 220, y: legendY + 10, fill: '#444b57' }, s.name)));
    const bars = svg('g', { class: 'bars' });
    keys.forEach((key, j) => {
      const y = top + j * rowH;
      const off = masked && masked[j] === null;
      bars.append(svg('text', { x: left - 8, y: y + rowH / 2 + 4, 'text-anchor': 'end', 'font-weight': 600, 'data-key': j }, key));
      series.forEach((s, k) => {
        const w = s.doc.stages.weights.values[hd][q][j];
        const by = y + 3 + k * 17;
        bars.append(svg('g', { 'data-key': j, 'data-series': k ? 'unscaled' : 'scaled' },
          off ? svg('rect', { x: left, y: by, width: 40, height: 14, fill: 'url(#masked)', stroke: '#9aa3b2' })
            : svg('rect', { x: left, y: by, width: Math.max(0.5, w * barW), height: 14, fill: s.fill }),
          svg('text', { x: left + (off ? 46 : Math.max(0.5, w * barW) + 6), y: by + 11, 'font-size': 11,
            'font-style': off ? 'italic' : null }, off ? 'masked' : pct(w))));
      });
    });
    const sy = top + keys.length * rowH + 24;
    const stats = svg('g', { class: 'stats', fill: '#16191f' });
    series.forEach((s, k) => stats.append(svg('text', { x: 24, y: sy + k * 18 },
      `${k ? 'unscaled' : 'scaled'}: entropy ${fmt(s.doc.stats.entropy[hd][q], 3)} nats · max weight ${pct(s.doc.stats.max_weight[hd][q])}`)));
    root.append(bars, stats);
    return root;
  }

  function downloadComparisonSvg() {
    if (!state.main || !state.alt || state.altPending) return;
    downloadSvg(comparisonSvg(), `${exportName()}_comparison_q${state.query}_head${state.head}.svg`);
  }

  // -- click to explain (POST /explain)

  function clearExplain(why) {
    if (state.explainController) state.explainController.abort();
    state.explainController = null;
    const had = state.explain !== null;
    state.explain = null;
    if (had) {
      ui.explainBody.replaceChildren();
      ui.explainStatus.textContent = why;
    }
  }

  /** Ask the service to explain one cell of the trace on screen: the request as traced, plus head, query, key. */
  async function explainCell(head, query, key) {
    if (STANDALONE || !state.main) return;
    const { doc, body } = state.main;
    const keyTokens = keyTokensOf(doc);
    if (state.explainController) state.explainController.abort();
    const controller = new AbortController();
    state.explainController = controller;
    state.explain = { head, query, key };
    ui.explainSection.setAttribute('aria-busy', 'true');
    ui.explainStatus.textContent = `Explaining head ${head}: query ${quoted(doc.tokens[query].text)} → key ${quoted(keyTokens[key].text)}…`;
    let answer;
    try {
      answer = await postJson(ENDPOINTS.explain, { ...body, head, query, key }, controller.signal);
    } catch (err) {
      if (err?.name === 'AbortError' || controller !== state.explainController) return;
      state.explainController = null;
      ui.explainSection.setAttribute('aria-busy', 'false');
      const items = err?.problem && Array.isArray(err.problem.errors) ? err.problem.errors : [];
      const words = items.length ? items.map((i) => `${i.pointer ? `${i.pointer.slice(1)}: ` : ''}${i.message}`).join('; ')
        : err instanceof ServiceError && err.status === 404 ? 'this service has no /explain endpoint'
          : err?.message || String(err);
      ui.explainStatus.textContent = `Could not explain the cell: ${words}`;
      ui.explainBody.replaceChildren();
      state.explain = null; // no cell is marked "explained below" (in place: the focus stays where it is)
      for (const cell of ui.maps.querySelectorAll('td.is-explained')) {
        cell.classList.remove('is-explained');
        const label = cell.getAttribute('aria-label').replace(' (explained below)', '');
        cell.setAttribute('aria-label', label);
        cell.title = label;
      }
      return;
    }
    if (controller !== state.explainController) return;
    state.explainController = null;
    ui.explainSection.setAttribute('aria-busy', 'false');
    renderExplain(answer.doc);
  }

  const STEP_NAMES = {
    products: 'Products', score: 'Score', scaled: 'Scale', row_max: 'Row max', exp: 'Exponential',
    denominator: 'Denominator', weight: 'Weight', contributions: 'Contributions',
  };

  /**
   * The service's explanation, drawn generically from its `steps` (formula = value, with the values it lists).
   * A masked cell says so: its weight is the mask's 0, not a probability the softmax gave a real key.
   */
  function renderExplain(x) {
    const doc = state.main.doc;
    const keyTokens = keyTokensOf(doc);
    const keyText = x.key_token ?? keyTokens[x.key]?.text;
    const steps = Array.isArray(x.steps) ? x.steps : [];
    const masked = x.masked === true;
    const maskedIds = new Set(['exp', 'weight']);
    const valueOf = (step) => {
      if (step.value === null || step.value === undefined) return masked && maskedIds.has(step.id) ? null : undefined;
      return masked && maskedIds.has(step.id) ? null : step.value;
    };
    const keyNames = Array.isArray(x.key_tokens) ? x.key_tokens : keyTokens.map((t) => t.text);
    const hidden = new Set(Array.isArray(x.masked_keys) ? x.masked_keys : []);
    // `values`: the products are one per coordinate of d_k; every other step lists one entry per key (a number, a
    // vector, or null), and a key the mask hides says so instead of showing its 0.
    const listOf = (step) => {
      const vals = step.values;
      if (!Array.isArray(vals)) return null;
      if (step.id === 'products') return vec(vals, 4, 8);
      return h('ul', { class: 'keys explain-keys', data: { values: step.id } }, vals.map((v, j) => {
        const off = v === null || hidden.has(j);
        return h('li', { class: off ? 'key is-masked' : 'key', data: { key: j } },
          h('span', { class: 'tok', text: keyNames[j] ?? String(j) }), h('span', { class: 'arrow', 'aria-hidden': 'true', text: '→' }),
          off ? h('span', { class: 'num', text: 'masked' })
            : Array.isArray(v) ? vec(v, 4, 8) : h('span', { class: 'num', text: fmtSmall(v) }));
      }));
    };
    const rows = steps.map((step) => {
      const v = valueOf(step);
      let shown;
      if (v === null) {
        shown = h('span', { class: 'num is-masked-value' }, step.id === 'weight'
          ? 'masked: 0 by the mask, not a probability from the softmax'
          : 'masked: exp(−∞) = 0, excluded from the softmax');
      } else if (typeof v === 'number') {
        shown = h('span', { class: 'num', title: String(v) }, step.id === 'weight' ? `${fmtSmall(v)} (${pct(v, 2)})` : fmtSmall(v));
      } else {
        shown = null;
      }
      const list = listOf(step);
      return h('tr', { data: { step: step.id } },
        h('th', { scope: 'row', class: 'wt-stage' }, STEP_NAMES[step.id] || step.id,
          step.stage ? h('span', { class: 'row-note', text: step.stage }) : null),
        h('td', { class: 'wt-op' }, h('code', { text: step.formula || '' }),
          step.note ? h('span', { class: 'op-note explain-note', text: ` ${step.note}` }) : null),
        h('td', { class: 'wt-result' }, shown ? h('span', { class: 'explain-eq' }, '= ', shown) : null, list));
    });
    const weightStep = steps.find((s) => s.id === 'weight');
    const summary = masked
      ? `masked${x.mask_reason ? ` (${x.mask_reason})` : ''}`
      : weightStep && typeof weightStep.value === 'number' ? `weight ${pct(weightStep.value, 2)}` : '';
    ui.explainStatus.textContent = `Head ${x.head}: query ${x.query} ${quoted(x.query_token)} → key ${x.key} ${quoted(keyText)}`
      + `${summary ? `: ${summary}` : ''}.`;
    const facts = h('p', { class: 'hint explain-facts' }, `d_k = ${x.d_k}; the scores are divided by `
      + `${typeof x.scale_factor === 'number' ? fmt(x.scale_factor, 4) : '?'}${x.scale === false ? ' (scaling off)' : ' (√d_k)'}.`);
    const banner = masked ? h('p', { class: 'explain-masked', data: { masked: 'true' } },
      h('strong', { text: 'Masked cell. ' }), x.mask_reason ? `${x.mask_reason}. ` : '',
      'It takes no part in the softmax: its weight is set to 0 by the mask, not computed as a probability.') : null;
    const table = h('table', { class: 'explain-table', data: { head: x.head, query: x.query, key: x.key } },
      h('caption', { class: 'visually-hidden', text: `How head ${x.head} weighs key ${quoted(keyText)} for query ${quoted(x.query_token)}` }),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col', text: 'Step' }), h('th', { scope: 'col', text: 'Formula' }),
        h('th', { scope: 'col', text: 'Value' }))),
      h('tbody', {}, rows));
    // With KV-cache decoding, the service compares the cell with the query's decoding step: its own words.
    const decodeNote = x.decode && typeof x.decode.note === 'string'
      ? h('p', { class: 'hint', data: { part: 'explain-decode' } }, `KV-cache decoding: ${x.decode.note}`
        + (typeof x.decode.weight_difference === 'number'
          ? ` (weight difference ${x.decode.weight_difference.toExponential(1).replace(/-/g, MINUS)})` : '') + '.')
      : null;
    ui.explainBody.replaceChildren(...[banner, facts, h('div', { class: 'table-scroll' }, table), decodeNote].filter(Boolean));
  }

  // ------------------------------------------------------------------ wiring

  function init() {
    ui.copy.addEventListener('click', copyCurl);
    ui.download.addEventListener('click', downloadJson);
    ui.downloadHtml.addEventListener('click', downloadHtml);
    ui.saturationSvg.addEventListener('click', downloadComparisonSvg);
    ui.decodeStep.addEventListener('input', () => {
      if (!state.main) return;
      state.step = Number(ui.decodeStep.value);
      writeHash(readRequest().body);
      renderDecode();
    });
    if (STANDALONE) {
      initStandalone();
      return;
    }
    readHash();
    updateDkLive();
    ui.form.addEventListener('submit', (e) => {
      e.preventDefault();
      clearTimeout(state.timer);
      refresh();
    });
    for (const input of [ui.sentence, ui.contextSentence, ui.contextTokens, ui.dModel, ui.seed, ui.ropeBase, ui.kvHeads, ui.window]) {
      input.addEventListener('input', () => schedule(DEBOUNCE_MS));
    }
    ui.heads.addEventListener('input', () => schedule(SLIDER_DEBOUNCE_MS));
    for (const input of [ui.scale, ui.causal, ui.pe, ui.ropePairing, ui.decode]) input.addEventListener('change', () => schedule(0));
    window.addEventListener('hashchange', () => {
      readHash();
      schedule(0);
    });
    loadLimits();
    schedule(0);
  }

  // ------------------------------------------------------------------ a saved trace (service/standalone.py)

  /** The trace a saved page embeds, or null on the live page. */
  function readEmbedded() {
    const meta = document.getElementById('trace-data');
    const raw = document.getElementById('trace-json');
    if (!meta || !raw) return null;
    // The saved file writes "<" as \u003c inside its JSON (so no closing script tag can end the element early); undo that
    // (only where the escape is not itself escaped) to get the service's exact bytes back for "Download trace JSON".
    const text = raw.textContent.replace(/(\\*)\\u003c/g, (all, slashes) => (slashes.length % 2 === 0 ? `${slashes}<` : all));
    return { ...JSON.parse(meta.textContent), text, doc: JSON.parse(text) };
  }

  /** The inputs show the configuration the trace was made with; the page draws it without the service. */
  function initStandalone() {
    document.documentElement.classList.add('is-standalone');
    for (const el of document.querySelectorAll('[data-service-only]')) el.hidden = true;
    for (const el of document.querySelectorAll('[data-standalone-only]')) el.hidden = false;
    const { request, doc } = EMBED;
    const cfg = doc.config;
    ui.sentence.value = typeof request.sentence === 'string' ? request.sentence : doc.tokens.map((t) => t.text).join(' ');
    ui.dModel.value = String(cfg.d_model);
    ui.heads.max = String(Math.max(cfg.num_heads, cfg.d_model));
    ui.heads.value = String(cfg.num_heads);
    ui.seed.value = String(cfg.seed);
    ui.scale.checked = cfg.scale;
    ui.causal.checked = cfg.causal;
    ui.pe.value = cfg.positional_encoding;
    if (cfg.rope_base !== undefined) ui.ropeBase.value = fmtBase(cfg.rope_base);
    if (cfg.rope_pairing !== undefined) ui.ropePairing.value = cfg.rope_pairing;
    ui.kvHeads.value = cfg.num_kv_heads !== undefined ? String(cfg.num_kv_heads) : '';
    ui.window.value = cfg.window !== undefined ? String(cfg.window) : '';
    ui.contextSentence.value = typeof request.context_sentence === 'string' ? request.context_sentence : '';
    ui.contextTokens.value = Array.isArray(request.context_tokens) ? request.context_tokens.join('\n') : '';
    ui.decode.checked = cfg.decode === true;
    for (const el of ui.form.elements) el.disabled = true; // nothing here can ask the service for another trace
    readSelection(new URLSearchParams(location.hash.slice(1)));
    updateDkLive();
    state.alt = EMBED.comparison ? { doc: EMBED.comparison, text: null, body: comparisonBody(request), ms: null } : null;
    showTrace({ doc, text: EMBED.text, body: request, ms: null });
    renderCurl(request);
    ui.main.setAttribute('aria-busy', 'false');
    window.addEventListener('hashchange', () => {
      readSelection(new URLSearchParams(location.hash.slice(1)));
      render();
    });
  }

  // Surface CSP problems loudly in development tools and tests.
  document.addEventListener('securitypolicyviolation', (e) => {
    document.documentElement.dataset.cspViolations = String(Number(document.documentElement.dataset.cspViolations || 0) + 1);
    console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI}`);
  });

  init();
})();
