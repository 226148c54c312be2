/*
 * attention-trace viewer.
 *
 * A plain client of the public JSON API, exactly as a third-party frontend
 * would be: it POSTs /trace (twice: with scale on and off, for the saturation
 * comparison) and GETs /version, and draws what comes back. It computes
 * nothing of the attention itself; the only arithmetic here is formatting,
 * colour scales, a row sum shown as a check, and the element-wise average of
 * the heads, which the page shows as the thing the model does *not* do.
 *
 * Runs under a strict Content-Security-Policy: no inline script or style, DOM
 * built with createElement/textContent only (no HTML strings are parsed), colours set
 * through CSS custom properties via the CSSOM.
 */
'use strict';

(() => {
  const MINUS = '\u2212';
  const DEFAULTS = Object.freeze({
    sentence: 'the cat sat', d_model: 24, num_heads: 1, seed: 0, scale: true, causal: false,
    positional_encoding: 'sinusoidal',
  });
  const limits = { max_d_model: 512, max_heads: 64, max_tokens: 256 };
  const HEATMAP_MAX_TOKENS = 48; // more than this many tokens: draw the first 48 only
  const CELL_NUMBERS_MAX_TOKENS = 12; // above this, cells show colour only; the readout has the value
  const THUMBS_MAX_CELLS = 30000;
  const VECTOR_NUMBERS_MAX = 96;

  const state = {
    query: 1, // selected query token index
    queryText: 'cat',
    head: 0, // selected head index (0-based)
    main: null, // {doc, text, body, ms}: the trace for the inputs as set
    alt: null, // the same request with scale flipped
    altError: null,
    seq: 0,
    controller: null,
    timer: 0,
    serviceVersion: null,
  };

  const $ = (id) => document.getElementById(id);
  const ui = {
    form: $('controls'), sentence: $('sentence'), dModel: $('d_model'), heads: $('num_heads'),
    headsValue: $('num_heads-value'), divisors: $('head-divisors'), seed: $('seed'),
    pe: $('positional_encoding'), scale: $('scale'), causal: $('causal'),
    dkCard: $('dk-card'), dkDModel: $('dk-dmodel'), dkHeads: $('dk-heads'), dkValue: $('dk-value'),
    dkStatus: $('dk-status'), dkMessage: $('dk-message'),
    factMatrices: $('fact-matrices'), factParams: $('fact-params'), factScale: $('fact-scale'),
    factScaleLabel: $('fact-scale-label'),
    copy: $('copy-curl'), download: $('download-json'), actionStatus: $('action-status'), curl: $('curl-command'),
    main: $('main'), tokenOptions: $('token-options'), headOptions: $('head-options'), traceStatus: $('trace-status'),
    problem: $('problem'), results: $('results'),
    walkthrough: $('walkthrough-body'), walkthroughTitle: $('walkthrough-title'),
    maps: $('maps-body'), mapsTitle: $('maps-title'), readout: $('maps-readout'), thumbs: $('thumbs-body'),
    saturation: $('saturation-body'), multihead: $('multihead-body'), footer: $('footer-versions'),
  };
  const fieldErrors = {
    '/sentence': $('sentence-error'), '/tokens': $('sentence-error'), '/d_model': $('d_model-error'),
    '/seed': $('seed-error'),
  };
  const fieldInputs = {
    '/sentence': ui.sentence, '/tokens': ui.sentence, '/d_model': ui.dModel, '/num_heads': ui.heads, '/seed': ui.seed,
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
  const int = (n) => n.toLocaleString('en-US');
  const quoted = (t) => `“${t}”`;
  const sub = (text) => h('sub', { text });

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
    return { body, errors };
  }

  function divisors(n) {
    const out = [];
    for (let i = 1; i <= Math.min(n, limits.max_heads); i += 1) if (n % i === 0) out.push(i);
    return out;
  }

  /** The d_k card's live arithmetic (before the service has answered). */
  function updateDkLive() {
    const dModel = readInt(ui.dModel);
    const heads = readInt(ui.heads);
    ui.headsValue.value = String(heads ?? '');
    ui.headsValue.textContent = String(heads ?? '');
    ui.dkDModel.textContent = dModel === null ? '?' : String(dModel);
    ui.dkHeads.textContent = String(heads ?? '?');
    if (dModel !== null && heads) {
      const dk = dModel / heads;
      ui.dkValue.textContent = Number.isInteger(dk) ? String(dk) : String(Number(dk.toFixed(3)));
      ui.factMatrices.textContent = String(3 * heads + 1);
      ui.factParams.textContent = int(4 * dModel * dModel);
    } else {
      ui.dkValue.textContent = '?';
    }
    if (dModel !== null) {
      // The slider spans 1 … d_model (never below the current value, so typing never clamps it).
      const top = Math.min(limits.max_heads, Math.max(dModel, heads || 1, 2));
      if (ui.heads.max !== String(top)) ui.heads.max = String(top);
    }
    if (dModel !== null && ui.divisors.dataset.for !== String(dModel)) {
      ui.divisors.replaceChildren(...divisors(dModel).map((d) => h('option', { value: d, label: String(d) })));
      ui.divisors.dataset.for = String(dModel);
    }
  }

  function setDkState(kind, status, message) {
    ui.dkCard.classList.remove('is-valid', 'is-invalid', 'is-pending');
    ui.dkCard.classList.add(`is-${kind}`);
    ui.dkStatus.textContent = status;
    ui.dkMessage.hidden = !message;
    ui.dkMessage.textContent = message || '';
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
    const node = fieldErrors[pointer];
    if (!node) return false;
    node.hidden = false;
    node.textContent = node.textContent ? `${node.textContent}; ${message}` : message;
    fieldInputs[pointer].setAttribute('aria-invalid', 'true');
    return true;
  }

  // ------------------------------------------------------------------ URL state

  function writeHash(body) {
    const p = new URLSearchParams();
    p.set('sentence', body.sentence);
    for (const k of ['d_model', 'num_heads', 'seed']) if (body[k] !== null) p.set(k, String(body[k]));
    p.set('scale', body.scale ? '1' : '0');
    p.set('causal', body.causal ? '1' : '0');
    if (body.positional_encoding !== 'sinusoidal') p.set('pe', body.positional_encoding);
    p.set('q', String(state.query));
    p.set('head', String(state.head + 1));
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
    ui.pe.value = get('pe', 'sinusoidal') === 'none' ? 'none' : 'sinusoidal';
    const q = Number(get('q', '1'));
    state.query = Number.isInteger(q) && q >= 0 ? q : 1;
    state.queryText = null;
    const head = Number(get('head', '1'));
    state.head = Number.isInteger(head) && head >= 1 ? head - 1 : 0;
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

  async function postTrace(body, signal) {
    const started = performance.now();
    const res = await fetch('trace', {
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

  function schedule(delay) {
    clearTimeout(state.timer);
    // The inputs changed: an answer still in flight describes old inputs; drop it.
    state.seq += 1;
    if (state.controller) state.controller.abort();
    state.controller = null;
    updateDkLive();
    setDkState('pending', 'Checking with the service…');
    state.timer = setTimeout(refresh, delay);
  }

  async function refresh() {
    const { body, errors } = readRequest();
    clearFieldErrors();
    const seq = ++state.seq;
    if (state.controller) state.controller.abort();
    state.controller = null;
    writeHash(body);
    renderCurl(body);
    if (Object.keys(errors).length) {
      for (const [pointer, message] of Object.entries(errors)) showFieldError(pointer, message);
      setDkState(errors['/d_model'] ? 'invalid' : 'pending',
        errors['/d_model'] ? 'Not a valid d_model' : 'Waiting for valid inputs',
        errors['/d_model'] ? `d_model: ${errors['/d_model']}` : '');
      showProblem(null);
      ui.main.setAttribute('aria-busy', 'false');
      markStale(true, 'Fix the highlighted input to update.');
      return;
    }
    const controller = new AbortController();
    state.controller = controller;
    ui.main.setAttribute('aria-busy', 'true');
    ui.traceStatus.textContent = 'Computing…';
    const alt = { ...body, scale: !body.scale };
    const [main, other] = await Promise.allSettled([postTrace(body, controller.signal), postTrace(alt, controller.signal)]);
    if (seq !== state.seq) return; // a newer request is on its way
    state.controller = null;
    ui.main.setAttribute('aria-busy', 'false');
    if (main.status === 'rejected') {
      if (main.reason?.name === 'AbortError') return;
      showError(main.reason);
      if (!state.main) {
        ui.walkthrough.replaceChildren(h('p', { class: 'hint', text: 'No trace yet: fix the inputs to see one.' }));
      }
      return;
    }
    state.main = main.value;
    state.alt = other.status === 'fulfilled' ? other.value : null;
    state.altError = other.status === 'rejected' ? other.reason : null;
    showProblem(null);
    markStale(false);
    const cfg = state.main.doc.config;
    setDkState('valid', `${cfg.d_model} / ${cfg.num_heads} = ${cfg.d_k}: each head works in ${cfg.d_k} dimensions`);
    ui.dkValue.textContent = String(cfg.d_k);
    ui.factMatrices.textContent = String(cfg.n_matrices);
    ui.factParams.textContent = int(cfg.n_parameters);
    ui.factScale.textContent = fmt(cfg.scale_factor, 4);
    ui.factScaleLabel.replaceChildren(cfg.scale ? '√d' : '1 (scaling off)', cfg.scale ? sub('k') : '');
    ui.download.disabled = false;
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
    } else {
      const dModelBad = fieldErrors['/d_model'].textContent !== '';
      setDkState(dModelBad ? 'invalid' : 'pending', dModelBad ? 'Not a valid d_model' : 'Waiting for a valid request',
        dModelBad ? `d_model: ${fieldErrors['/d_model'].textContent}` : '');
    }
    ui.download.disabled = true;
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
    const ms = Math.round(state.main.ms);
    ui.traceStatus.textContent = `${tokens.length} token${tokens.length === 1 ? '' : 's'} · d_model ${cfg.d_model} · `
      + `${cfg.num_heads} head${cfg.num_heads === 1 ? '' : 's'} of d_k ${cfg.d_k} · traced in ${ms} ms`;
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
        'aria-label': `head ${i + 1} of ${heads}`,
        onchange: () => select(null, i),
      });
      return h('label', { class: 'chip chip-head', for: `head-${i}` }, input, h('span', { class: 'chip-text', text: `${i + 1}` }));
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

  function renderWalkthrough() {
    const { doc } = state.main;
    const S = doc.stages;
    const cfg = doc.config;
    const q = state.query;
    const hd = state.head;
    const tokens = doc.tokens;
    const tok = tokens[q].text;
    const headName = cfg.num_heads > 1 ? ` · head ${hd + 1} of ${cfg.num_heads}` : '';
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
    const peOn = cfg.positional_encoding !== 'none';

    const rows = [
      stageRow('input', 'Embed',
        [h('code', { text: peOn ? `E[${tok}] + PE(${q})` : `E[${tok}]` }),
          h('span', { class: 'op-note', text: ` one ${cfg.d_model}-dim ${peOn ? 'position-aware' : 'context-free, position-blind'} vector` })],
        h('div', { class: 'stack' },
          h('div', { class: 'vec-line', data: { part: 'x' } }, h('span', { class: 'vec-name', text: 'x =' }), vec(S.input.values[q])),
          h('div', { class: 'vec-line muted-line' }, h('span', { class: 'vec-name', text: 'E =' }), vec(S.token_embedding.values[q])),
          peOn && pe ? h('div', { class: 'vec-line muted-line' }, h('span', { class: 'vec-name', text: 'PE =' }), vec(pe.values[q])) : null)),
      stageRow('project', 'Project',
        [h('code', { text: 'Q = x·W_Qᵀ, K = x·W_Kᵀ, V = x·W_Vᵀ' }),
          h('span', { class: 'op-note', text: ` each ${cfg.d_k}-dim${cfg.num_heads > 1 ? `, with head ${hd + 1}'s own matrices` : ''}` })],
        h('div', { class: 'stack' },
          ['q', 'k', 'v'].map((s) => h('div', { class: 'vec-line', data: { part: s } },
            h('span', { class: 'vec-name', text: `${s.toUpperCase()}_${tok} =` }), vec(S[s].values[hd][q]))))),
      stageRow('scores', h('span', {}, 'Score ', h('code', { text: 'QKᵀ' })),
        h('code', { text: `Q_${tok} · K_j for each key j` }),
        keyList('scores', tokens, scores, (v) => h('span', { class: 'num', text: fmt(v, 4) }))),
      stageRow('scaled_scores', h('span', {}, 'Scale ', h('code', { text: cfg.scale ? `/√${cfg.d_k}` : '/1' })),
        cfg.scale
          ? h('span', {}, 'divide each by ', h('code', { text: `√${cfg.d_k}` }), ` = ${fmt(cfg.scale_factor, 4)}`)
          : h('span', {}, 'scaling off: divide by 1 (the raw scores go to softmax)'),
        keyList('scaled_scores', tokens, scaled, (v) => h('span', { class: 'num', text: fmt(v, 4) }))),
    ];
    if (masked) {
      rows.push(stageRow('masked_scores', 'Mask',
        h('span', {}, `keys after ${quoted(tok)} are set to `, h('code', { text: '−∞' }), ': a token sees only itself and earlier tokens'),
        keyList('masked_scores', tokens, masked, (v, m) => h('span', { class: 'num', text: m ? 'masked (−∞)' : fmt(v, 4) }))));
    }
    rows.push(
      stageRow('weights', 'Softmax %',
        h('span', {}, h('code', { text: 'exp(s_j) / Σ exp(s)' }), ' over the row'),
        h('div', { class: 'stack' },
          keyList('weights', tokens, weights.map((v, j) => (masked && masked[j] === null ? null : v)),
            (v, m) => (m
              ? h('span', { class: 'num', text: 'masked (0%)' })
              : h('span', { class: 'num' }, h('span', { class: 'pct', text: pct(v) }),
                h('span', { class: 'frac', text: ` (${fmt(v, 4)})` })))),
          h('p', { class: 'wt-check' },
            h('span', { data: { check: 'sum' } }, `Σ = ${fmt(sum, 4)}`), ' · ',
            h('span', { data: { check: 'entropy' } }, `entropy ${fmt(entropy, 3)} nats`), ' · ',
            h('span', { data: { check: 'max' } }, `max ${pct(maxW)}`)))),
      stageRow('context', 'Weight V',
        h('span', {}, h('code', { text: 'Σ_j w_j · V_j' }), ' the blend of value vectors'),
        h('div', { class: 'vec-line', data: { part: 'context' } }, h('span', { class: 'vec-name', text: 'context ≈' }), vec(context))),
      stageRow('concat', 'Concat',
        h('span', {}, h('code', { text: `[head₁ | … | head_${cfg.num_heads}]` }), ` ${cfg.num_heads} × ${cfg.d_k} = ${cfg.num_heads * cfg.d_k} values`),
        h('div', { class: 'vec-line', data: { part: 'concat' } }, vec(S.concat.values[q]))),
      stageRow('output', h('span', {}, 'W', sub('O')),
        h('span', {}, h('code', { text: 'concat · W_Oᵀ' }), ` mixes the heads back into d_model = ${cfg.d_model}`),
        h('div', { class: 'vec-line', data: { part: 'output' } }, h('span', { class: 'vec-name', text: 'output =' }), vec(S.output.values[q]))),
    );

    const table = h('table', { class: 'walkthrough-table' },
      h('caption', { class: 'visually-hidden', text: `Stages of attention for query ${quoted(tok)}` }),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col', text: 'Stage' }), h('th', { scope: 'col', text: 'Operation' }),
        h('th', { scope: 'col', text: `Result for query ${quoted(tok)}` }))),
      h('tbody', {}, rows));
    ui.walkthrough.replaceChildren(h('div', { class: 'table-scroll' }, table), explainWeights(tokens, q, weights, masked));
  }

  function explainWeights(tokens, q, weights, masked) {
    const order = weights.map((w, j) => j).filter((j) => !(masked && masked[j] === null)).sort((a, b) => weights[b] - weights[a]);
    const top = order[0];
    const self = top === q;
    const parts = [`${quoted(tokens[q].text)} keeps `];
    if (self) {
      parts.push(`${pct(weights[q])} of its own value`);
    } else {
      parts.push(`${pct(weights[q])} of its own value and takes the most, ${pct(weights[top])}, from ${quoted(tokens[top].text)}`);
    }
    const rest = order.filter((j) => j !== q && j !== top);
    if (rest.length && rest.length <= 4) {
      parts.push(`; it mixes in ${rest.map((j) => `${pct(weights[j])} of ${quoted(tokens[j].text)}`).join(', ')}`);
    }
    parts.push('. With random, untrained weights this pattern is an artefact of the initialisation, not understanding.');
    return h('p', { class: 'explain' }, parts.join(''));
  }

  // -- heatmaps

  function heatmap(spec) {
    const { stage, title, formula, matrix, tokens, range, kind, maskRow } = spec;
    const n = Math.min(matrix.length, HEATMAP_MAX_TOKENS);
    const compact = n > CELL_NUMBERS_MAX_TOKENS;
    const labels = tokens.slice(0, n).map((t) => t.text);
    const valueText = (v) => (kind === 'weight' ? `${fmt(v, 4)} (${pct(v, 2)})` : fmt(v, 4));
    const head = h('tr', {}, h('th', { class: 'hm-corner', scope: 'col' }, h('span', { class: 'visually-hidden', text: 'query \\ key' })),
      labels.map((l, j) => h('th', { scope: 'col', class: 'hm-col', title: `key ${j}: ${l}` }, h('span', { class: 'hm-label', text: l }))));
    const body = [];
    for (let i = 0; i < n; i += 1) {
      const cells = [];
      for (let j = 0; j < n; j += 1) {
        const v = matrix[i][j];
        const isMasked = v === null || (maskRow && maskRow(i, j));
        const label = isMasked
          ? `${title}: query ${quoted(labels[i])} → key ${quoted(labels[j])}: masked${kind === 'weight' ? ' (weight 0)' : ' (−∞)'}`
          : `${title}: query ${quoted(labels[i])} → key ${quoted(labels[j])}: ${valueText(v)}`;
        const td = h('td', {
          class: `hm-cell${isMasked ? ' is-masked' : ''}`, tabindex: -1, title: label, 'aria-label': label,
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
      'aria-label': `${title}, head ${state.head + 1}: rows are queries, columns are keys`,
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
      if (row !== state.query) select(row, null, { focus: () => focusCell(stage, row, Number(cell.dataset.col || 0)) });
    });
    return h('figure', { class: 'heatmap', data: { stage } },
      h('figcaption', {}, h('span', { class: 'hm-title', text: title }), ' ', h('code', { class: 'hm-formula', text: formula })),
      h('div', { class: 'hm-scroll' }, table),
      legend(range, kind, spec.showMasked));
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
    let row = Number(cell.dataset.row);
    let col = Number(cell.dataset.col);
    switch (e.key) {
      case 'ArrowRight': col = Math.min(n - 1, col + 1); break;
      case 'ArrowLeft': col = Math.max(0, col - 1); break;
      case 'ArrowDown': row = Math.min(n - 1, row + 1); break;
      case 'ArrowUp': row = Math.max(0, row - 1); break;
      case 'Home': col = 0; if (e.ctrlKey) row = 0; break;
      case 'End': col = n - 1; if (e.ctrlKey) row = n - 1; break;
      case 'Enter':
      case ' ':
        e.preventDefault();
        select(row, null, { focus: () => focusCell(table.dataset.stage, row, col) });
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
    const masked = S.masked_scores;
    const isMasked = masked ? (i, j) => masked.values[hd][i][j] === null : null;
    ui.mapsTitle.replaceChildren(`Attention maps${cfg.num_heads > 1 ? ` · head ${hd + 1} of ${cfg.num_heads}` : ''}`);
    const maps = [
      heatmap({ stage: 'scores', title: 'Scores', formula: 'QKᵀ', matrix: S.scores.values[hd], tokens,
        range: extent(S.scores.values[hd]), kind: 'score' }),
      heatmap({ stage: 'scaled_scores', title: 'Scaled scores', formula: cfg.scale ? `QKᵀ/√${cfg.d_k}` : 'QKᵀ/1 (scaling off)',
        matrix: S.scaled_scores.values[hd], tokens, range: extent(S.scaled_scores.values[hd]), kind: 'score' }),
    ];
    if (masked) {
      maps.push(heatmap({ stage: 'masked_scores', title: 'Masked scores', formula: 'future keys → −∞', matrix: masked.values[hd],
        tokens, range: extent(masked.values[hd]), kind: 'score', showMasked: true }));
    }
    maps.push(heatmap({ stage: 'weights', title: 'Weights', formula: 'softmax: rows sum to 1', matrix: S.weights.values[hd],
      tokens, range: [0, 1], kind: 'weight', maskRow: isMasked, showMasked: !!masked }));
    const note = tokens.length > HEATMAP_MAX_TOKENS
      ? h('p', { class: 'hint', text: `Showing the first ${HEATMAP_MAX_TOKENS} of ${tokens.length} tokens; download the JSON for all of them.` })
      : null;
    // Columns as wide as one map needs: about 3.6em a cell plus the row labels.
    const n = Math.min(tokens.length, HEATMAP_MAX_TOKENS);
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
    if (cfg.num_heads === 1) {
      ui.thumbs.replaceChildren(h('p', { class: 'hint' },
        'One head. Move the head slider (try 4 heads at d_model 24) to see each head attend differently.'));
      return;
    }
    if (cfg.num_heads * n * n > THUMBS_MAX_CELLS) {
      ui.thumbs.replaceChildren(h('p', { class: 'hint', text: 'Too many heads × tokens to draw every head; pick a head above.' }));
      return;
    }
    const masked = doc.stages.masked_scores;
    const thumbs = W.map((m, hi) => {
      const grid = h('span', { class: 'thumb-grid', vars: { '--n': String(n) }, 'aria-hidden': 'true' });
      for (let i = 0; i < n; i += 1) {
        for (let j = 0; j < n; j += 1) {
          const off = masked && masked.values[hi][i][j] === null;
          const c = h('span', { class: `thumb-cell${off ? ' is-masked' : ''}${i === state.query ? ' is-query' : ''}` });
          if (!off) shade(c, m[i][j]);
          grid.append(c);
        }
      }
      const row = m[state.query];
      const top = row.indexOf(Math.max(...row));
      return h('button', {
        type: 'button', class: 'thumb', 'aria-pressed': hi === state.head ? 'true' : 'false',
        'aria-label': `Head ${hi + 1}: ${quoted(doc.tokens[state.query].text)} attends most to ${quoted(doc.tokens[top].text)} (${pct(row[top])})`,
        onclick: () => select(null, hi),
      }, grid, h('span', { class: 'thumb-caption' }, `head ${hi + 1}`, h('span', { class: 'thumb-top', text: `${doc.tokens[top].text} ${pct(row[top], 0)}` })));
    });
    ui.thumbs.replaceChildren(
      h('h3', { class: 'subhead', text: 'Every head\'s weights' }),
      h('p', { class: 'hint', text: 'Same sentence, different projections, different soft distributions. Pick a head to inspect it.' }),
      h('div', { class: 'thumbs' }, thumbs));
  }

  // -- saturation

  function renderSaturation() {
    const cfg = state.main.doc.config;
    if (!state.alt) {
      const msg = state.altError ? `The comparison trace failed: ${state.altError.message}` : 'No comparison trace.';
      ui.saturation.replaceChildren(h('p', { class: 'problem-inline', text: msg }));
      return;
    }
    const scaled = cfg.scale ? state.main.doc : state.alt.doc;
    const unscaled = cfg.scale ? state.alt.doc : state.main.doc;
    const q = state.query;
    const hd = state.head;
    const tokens = scaled.tokens;
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
        tokens.map((t, j) => h('tr', { data: { key: j }, class: j === q ? 'is-query' : null },
          h('th', { scope: 'row', text: t.text }), variants.map((v) => weightCell(v, j)))),
        h('tr', { class: 'stat-row', data: { stat: 'entropy' } },
          h('th', { scope: 'row' }, 'entropy', h('span', { class: 'row-note', text: 'nats, from stats' })),
          variants.map((v) => h('td', { class: 'num', data: { variant: v.id }, text: fmt(v.doc.stats.entropy[hd][q], 3) }))),
        h('tr', { class: 'stat-row', data: { stat: 'max_weight' } },
          h('th', { scope: 'row' }, 'max weight', h('span', { class: 'row-note', text: 'from stats' })),
          variants.map((v) => h('td', { class: 'num', data: { variant: v.id }, text: pct(v.doc.stats.max_weight[hd][q]) })))));
    const visible = (scaled.stages.masked_scores
      ? scaled.stages.masked_scores.values[hd][q].filter((v) => v !== null).length : tokens.length);
    const ms = scaled.stats.max_weight[hd][q];
    const mu = unscaled.stats.max_weight[hd][q];
    const es = scaled.stats.entropy[hd][q];
    const eu = unscaled.stats.entropy[hd][q];
    const text = visible <= 1
      ? `${quoted(tokens[q].text)} can see only itself here, so its single weight is 100% either way.`
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
      h('span', { class: 'mh-label' }, `head ${i + 1}`, h('span', { class: 'row-note', text: `length ${fmt(norm(hv), 2)}` })),
      strip(hv, range, { label: `head ${i + 1} output for ${tok}`, className: 'strip-head' })));
    const concatGroups = heads.map((hv, i) => h('span', { class: 'concat-group', data: { head: i } },
      h('span', { class: 'concat-group-label', text: `h${i + 1}` }),
      strip(concat.slice(i * cfg.d_k, (i + 1) * cfg.d_k), range, { label: `concat, head ${i + 1}'s slots`, group: i })));
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
        h('h3', { class: 'subhead' }, 'Then W', sub('O'), h('span', { class: 'muted', text: ` mixes the heads: output = concat·W_Oᵀ (d_model ${cfg.d_model})` })),
        strip(output, extent(output), { label: `output for ${tok}` })),
    ];
    ui.multihead.replaceChildren(...kids);
  }

  // ------------------------------------------------------------------ actions

  function curlFor(body) {
    const url = new URL('trace', location.href).href;
    return `curl -s ${shellQuote(url)} -H 'content-type: application/json' -d ${shellQuote(JSON.stringify(body))}`;
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

  function downloadJson() {
    if (!state.main) return;
    const b = state.main.body;
    const slug = b.sentence.trim().toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '').slice(0, 40) || 'trace';
    const name = `attention-trace_${slug}_d${b.d_model}_h${b.num_heads}_seed${b.seed}${b.scale ? '' : '_unscaled'}${b.causal ? '_causal' : ''}.json`;
    const url = URL.createObjectURL(new Blob([state.main.text], { type: 'application/json' }));
    const a = h('a', { href: url, download: name, class: 'visually-hidden' });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    ui.actionStatus.textContent = `Saved ${name} (the exact response, every float in full).`;
  }

  // ------------------------------------------------------------------ wiring

  function init() {
    readHash();
    updateDkLive();
    ui.form.addEventListener('submit', (e) => {
      e.preventDefault();
      clearTimeout(state.timer);
      refresh();
    });
    ui.sentence.addEventListener('input', () => schedule(300));
    for (const input of [ui.dModel, ui.seed]) input.addEventListener('input', () => schedule(250));
    ui.heads.addEventListener('input', () => schedule(150));
    for (const input of [ui.scale, ui.causal, ui.pe]) input.addEventListener('change', () => schedule(0));
    ui.copy.addEventListener('click', copyCurl);
    ui.download.addEventListener('click', downloadJson);
    window.addEventListener('hashchange', () => {
      readHash();
      schedule(0);
    });
    loadLimits();
    schedule(0);
  }

  // Surface CSP problems loudly in development tools and tests.
  document.addEventListener('securitypolicyviolation', (e) => {
    document.documentElement.dataset.cspViolations = String(Number(document.documentElement.dataset.cspViolations || 0) + 1);
    console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI}`);
  });

  init();
})();
