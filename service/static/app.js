/*
 * attention-trace viewer: the page itself. Its state, the inputs and the d_k card, asking the service for a trace
 * as the inputs change, the actions (curl, downloads), the wiring of events, and the start, live or saved.
 *
 * A plain client of the public JSON API, exactly as a third-party frontend would be: it POSTs /trace (once, and
 * once more with scale flipped for the saturation comparison only when the first is valid; with `generate` for the
 * next-token panel's "Generate a token"), POSTs /explain for a clicked cell and /trace/html for the offline export,
 * GETs /version, and draws what comes back. It computes
 * nothing of the attention itself; the only arithmetic here is formatting, colour scales, a row sum shown as a
 * check, and the element-wise average of the heads, which the page shows as the thing the model does *not* do.
 *
 * The same scripts draw a saved trace (service/offline_page.py): when the page embeds one (<script
 * type="application/json" id="trace-data">), they draw that, read-only, and never make a request.
 *
 * The scripts, in the order index.html loads them (classic scripts with `defer`, each adding its part to the one
 * namespace globalThis.AttentionTrace; the saved page inlines them in the same order):
 *   format.js     numbers and colours as the page writes them (pure)
 *   trace.js      reading a /trace answer: key tokens, K/V heads, export names (pure)
 *   url-state.js  the inputs as data: the request, the d_k card's counts, the address both ways (pure)
 *   heads.js      interpretable heads: the kinds' names, the presets and their captions (pure)
 *   svg.js        the SVG exports, as an element tree written as escaped XML (pure)
 *   cell.js       one cell, number by number, from a trace alone: /explain's answer for a saved page (pure)
 *   block.js      a stack's block: which it is, its diagram's layout, the residual stream's lengths (pure)
 *   api.js        the service's endpoints, or the trace a saved page embeds
 *   render.js     drawing the trace, section by section
 *   explain.js    one cell, number by number (POST /explain)
 *   app.js        this file
 *
 * Runs under a strict Content-Security-Policy: no inline script or style, DOM built with createElement/textContent
 * only (no HTML strings are parsed), colours set through CSS custom properties via the CSSOM.
 *
 * Heads, tokens and K/V heads are numbered from 0 everywhere, as in the API (and the command line's "Head 0 of 4").
 */
'use strict';

(() => {
  const AT = globalThis.AttentionTrace;
  const { fmt, int } = AT.format;
  const { exportName, isStack, layerView } = AT.trace;
  const { PRESET_FIELDS, FIELDS, FIELD } = AT.urlState;
  const { requestFrom, fieldsFromTrace, comparisonBody, divisors, dkCard, fieldError, curlFor, hashFor,
    fieldsFromHash, selectionFromHash, uiWords, HEAD_KINDS, headKinds, kindsText, readInt } = AT.urlState;
  const { PRESETS, kindLabel, presetOf, captionFor } = AT.heads;
  const { svgFile, comparisonSvg } = AT.svg;
  const { ServiceError, ENDPOINTS, postJson, getVersion, postHtml, readEmbedded, withView } = AT.api;
  const { h, spoken } = AT.render;

  const limits = { max_d_model: 512, max_heads: 64, max_tokens: 256 };
  // Keystroke to numbers: a trace and its drawing take 20-80 ms; the debounce only has to skip the keys of
  // one burst of typing (docs/viewer.md has the measurements).
  const DEBOUNCE_MS = 120;
  const SLIDER_DEBOUNCE_MS = 60;
  const PENDING_NOTE_MS = 400; // "Checking with the service…" only for an answer slower than this
  const EMBED = readEmbedded(document);
  const STANDALONE = EMBED !== null;

  const state = {
    query: 1, // selected query token index
    queryText: 'cat',
    head: 0, // selected head index (0-based)
    step: null, // selected KV-cache decoding step (null: the first one)
    temperature: null, // the next-token panel's temperature (null: the answer's own)
    generated: 0, // how many of the answer's generated tokens the next-token panel has appended
    gen: null, // the live page's generation (generateStep): {key, request, limit, doc, error, pending}, or null
    colour: 'auto', // the maps' colour scale (format.js, SCALE_MODES)
    text: 1, // the projector text scale (url-state.js, TEXT_SCALES)
    theme: 'system', // the colour theme (url-state.js, THEMES; style.css)
    present: false, // present mode: one stage at a time
    slide: null, // present mode's slide (trace.js, presentSlides; null: the first)
    part: null, // present mode's figure of the slide, when it is shown one figure a step (0-based; null: the first)
    layer: null, // a stack's layer shown (0-based; null: the first); state.main.doc is that layer (trace.js, layerView)
    bstage: null, // a stack's block box shown (block.js's diagram ids; null: the layer's first)
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
    pendingKey: null, // the address's clicked cell (its key), explained when the trace arrives
    explainController: null,
    serviceVersion: null,
    ablate: null, // {layer, head}: the head whose output the trace zeroes (null: none)
    ablateMlp: null, // the layer whose MLP output the trace zeroes (null: none)
  };

  const $ = (id) => document.getElementById(id);
  const ui = {
    form: $('controls'), sentence: $('sentence'), dModel: $('d_model'), heads: $('num_heads'),
    headsValue: $('num_heads-value'), divisors: $('head-divisors'), seed: $('seed'),
    pe: $('positional_encoding'), scale: $('scale'), causal: $('causal'),
    ropeFields: $('rope-fields'), ropeBase: $('rope_base'), ropePairing: $('rope_pairing'),
    kvHeads: $('num_kv_heads'), window: $('window'), contextSentence: $('context_sentence'), decode: $('decode'),
    contextTokens: $('context_tokens'), block: $('block'), numLayers: $('num_layers'),
    layerPicker: $('layer-picker'), layerOptions: $('layer-options'),
    ablateHead: $('ablate-head'), ablateLabel: $('ablate-label'), intervention: $('intervention'),
    ablateMlp: $('ablate-mlp'), ablateMlpLabel: $('ablate-mlp-label'),
    interventionBody: $('intervention-body'),
    blockSection: $('block-section'), blockSvg: $('download-block-svg'), blockPng: $('download-block-png'), blockTitle: $('block-title'), blockDiagram: $('block-diagram'), blockStage: $('block-stage'),
    residualSection: $('residual-section'), residualBody: $('residual-body'),
    kvSection: $('kv-section'), kvBody: $('kv-body'),
    decodeSection: $('decode-section'), decodeBody: $('decode-body'), decodeStep: $('decode-step'),
    decodeStepValue: $('decode-step-value'),
    nextTokenSection: $('next-token-section'), nextTokenBody: $('next-token-body'), lmTemperature: $('lm-temperature'),
    lmTemperatureValue: $('lm-temperature-value'), lmGenerate: $('lm-generate'), lmGenerateReset: $('lm-generate-reset'),
    lmDecoding: $('lm-decoding'),
    lmGenerateStatus: $('lm-generate-status'),
    factMatricesLabel: $('fact-matrices-label'), factParamsLabel: $('fact-params-label'),
    dkCard: $('dk-card'), dkDModel: $('dk-dmodel'), dkHeads: $('dk-heads'), dkValue: $('dk-value'),
    dkStatus: $('dk-status'), dkMessage: $('dk-message'),
    factMatrices: $('fact-matrices'), factParams: $('fact-params'), factScale: $('fact-scale'),
    factScaleLabel: $('fact-scale-label'), factStack: $('fact-stack'), factStackLabel: $('fact-stack-label'),
    factStackValue: $('fact-stack-value'),
    copy: $('copy-curl'), download: $('download-json'), downloadHtml: $('download-html'),
    actionStatus: $('action-status'), curl: $('curl-command'),
    main: $('main'), tokenOptions: $('token-options'), headOptions: $('head-options'), traceStatus: $('trace-status'),
    problem: $('problem'), results: $('results'),
    walkthrough: $('walkthrough-body'), walkthroughTitle: $('walkthrough-title'),
    maps: $('maps-body'), mapsTitle: $('maps-title'), readout: $('maps-readout'), thumbs: $('thumbs-body'),
    saturation: $('saturation-body'), saturationSection: $('saturation'), saturationSvg: $('download-saturation-svg'), saturationPng: $('download-saturation-png'),
    multihead: $('multihead-body'), footer: $('footer-versions'),
    explainSection: $('explain-section'), explainStatus: $('explain-status'), explainBody: $('explain-body'),
    matrices: $('matrices-body'), matricesTitle: $('matrices-title'), matricesReadout: $('matrices-readout'),
    colourScale: $('colour-scale'), textScale: $('text-scale'), theme: $('theme'),
    presentToggle: $('present-toggle'), presentBar: $('present-bar'), presentPrev: $('present-prev'),
    presentNext: $('present-next'), presentExit: $('present-exit'), presentWhere: $('present-where'),
    presentTitle: $('present-title'), presentPart: $('present-part'),
    headPresets: $('head-presets'), headKinds: $('head-kinds'), sharpness: $('sharpness'),
    presetCaption: $('preset-caption'), presetCaptionTitle: $('preset-caption-title'), presetCaptionBody: $('preset-caption-body'),
  };
  // /trace's generation options (fields.js, generate_options: the request's, not the layer's), each with the
  // next-token panel's input for it, which index.html draws as input#lm-<name, dashed> (`generate` has none: the
  // panel's button asks for it; #lm-generate is that button).
  const GENERATE_OPTIONS = AT.fields.generate_options;
  const OPTION_INPUTS = GENERATE_OPTIONS
    .map((f) => [f, document.querySelector(`input#lm-${f.name.replaceAll('_', '-')}`)])
    .filter(([, input]) => input !== null);
  const MAX_GENERATE = GENERATE_OPTIONS.find((f) => f.name === 'generate').maximum;

  /** A declared field's bounds in words, for its hint: " (0 < sharpness ≤ 1000)", or '' without bounds. */
  function boundsText(f) {
    const low = f.above !== undefined ? `${f.above} < ` : f.minimum !== undefined ? `${f.minimum} ≤ ` : '';
    const high = f.maximum !== undefined ? ` ≤ ${f.maximum}` : '';
    return low || high ? ` (${low}${f.name}${high})` : '';
  }

  /**
   * The form's controls come from the declaration (engine/fields.py, through fields.js). A field index.html draws
   * (an element with its name, or its error line) gets its bounds from it; any other gets a control made here: a
   * choice, a switch, or a number with its bounds, its help as the hint, in the fieldset of its variant
   * (`fields-<variant>`) or under "More settings". Nothing here names a field.
   */
  function drawDeclaredControls() {
    // The next-token panel's generation options: their bounds from the declaration (an exclusive one is the
    // service's to refuse).
    for (const [f, input] of OPTION_INPUTS) {
      const low = f.minimum ?? f.above;
      if (low !== undefined) input.min = String(low);
      if (f.maximum !== undefined) input.max = String(f.maximum);
      input.title = `${f.help}${boundsText(f)}`;
    }
    for (const f of FIELDS) {
      const drawn = $(f.name) ?? $(`${f.name}-error`);
      const low = f.minimum ?? f.above;
      if (drawn) {
        if (drawn.type === 'number' && low !== undefined) drawn.min = String(low);
        if (drawn.type === 'number' && f.maximum !== undefined) drawn.max = String(f.maximum);
        continue;
      }
      const box = $(`fields-${f.variant}`) ?? $('fields-more');
      const described = `${f.name}-hint ${f.name}-error`;
      const number = f.kind === 'int' || f.kind === 'float';
      const control = f.kind === 'choice'
        ? h('select', { id: f.name, name: f.name, form: 'controls', 'aria-describedby': described },
          h('option', { value: '', text: f.default === null ? 'default' : String(f.default) }),
          f.choices.map((c) => h('option', { value: c, text: c })))
        : h('input', { id: f.name, name: f.name, form: 'controls', 'aria-describedby': described,
          type: f.kind === 'bool' ? 'checkbox' : number ? 'number' : 'text', step: number ? (f.kind === 'int' ? '1' : 'any') : null,
          inputmode: number ? (f.kind === 'int' ? 'numeric' : 'decimal') : null, min: number ? low : null,
          max: number ? f.maximum : null, placeholder: f.kind === 'bool' ? null : f.default === null ? 'default' : String(f.default) });
      box.append(h('div', { class: 'field' }, h('label', { for: f.name, text: f.name.replace(/_/g, ' ') }), control,
        h('p', { id: `${f.name}-hint`, class: 'hint', text: `${f.help}${boundsText(f)}` }),
        h('p', { id: `${f.name}-error`, class: 'field-error', hidden: true })));
      box.hidden = false;
    }
    for (const node of document.querySelectorAll('[data-bounds]')) node.textContent = boundsText(FIELD[node.dataset.bounds]);
  }
  drawDeclaredControls();

  /** Each declared field's control, by name (url-state.js's fields are their values). */
  const controls = FIELDS.map((f) => [f.name, $(f.name)]).filter(([, el]) => el !== null);
  /** Where a service message about a field goes: its error line, and the control it marks invalid. */
  const fieldErrors = Object.fromEntries([...FIELDS.map((f) => f.name), 'decode']
    .filter((name) => $(`${name}-error`)).map((name) => [`/${name}`, $(`${name}-error`)]));
  fieldErrors['/tokens'] = fieldErrors['/sentence'];
  const fieldInputs = Object.fromEntries(Object.keys(fieldErrors).map((pointer) => [pointer, $(pointer.slice(1))]));
  Object.assign(fieldInputs, { '/tokens': ui.sentence, '/head_weights': ui.headKinds });

  const explainer = AT.explain.create({ state, ui, saved: STANDALONE });
  const { explainCell, clearExplain } = explainer;
  const renderer = AT.render.create({ state, ui, saved: STANDALONE, actions: { select, explainCell, downloadSvg, downloadPng, demo, selectLayer, selectBox } });
  const { renderSelection, renderPickers, syncPickers, renderStatus, renderFooter, renderDecode, renderSaturation,
    renderPresent, renderBlock, renderNextToken } = renderer;

  // ------------------------------------------------------------------ inputs

  /** The form's values as the controls hold them (url-state.js reads them): each declared field's control (a
   * switch's state, any other's text), the heads' kinds, and decoding. */
  function readFields() {
    const out = Object.fromEntries(controls.map(([name, el]) => [name, el.type === 'checkbox' ? el.checked : el.value]));
    return { ...out, head_weights: kindsText(headSelects().map((sel) => sel.value)), decode: ui.decode.checked };
  }

  /** The per-head kind choices, head 0 first. */
  const headSelects = () => [...ui.headKinds.querySelectorAll('select')];

  /** One kind choice a head (the service's kinds), set to `kinds`; each change asks for a trace. */
  function renderHeadKinds(kinds) {
    ui.headKinds.replaceChildren(...kinds.map((kind, i) => {
      const select = h('select', {
        id: `head-kind-${i}`, form: 'controls', 'aria-describedby': 'head_weights-error', disabled: STANDALONE ? '' : null,
        onchange: () => schedule(0),
      }, HEAD_KINDS.map((k) => h('option', { value: k, text: k === 'seeded' ? 'seeded (random)' : kindLabel(k) })));
      select.value = HEAD_KINDS.includes(kind) ? kind : 'seeded';
      return h('div', { class: 'head-kind' }, h('label', { for: `head-kind-${i}`, text: `head ${i}` }), select);
    }));
  }

  /** The head slider moved: as many kind choices as heads (new heads seeded, the others kept). */
  function resizeHeadKinds() {
    const n = readInt(ui.heads.value) ?? 1;
    if (headSelects().length !== n) renderHeadKinds(headKinds(readFields().head_weights, n));
  }

  /**
   * An interpretable-heads preset (heads.js): the whole form set to its fields, the view to the query token, head
   * and layer that show its job, then a trace.
   */
  function choosePreset(preset) {
    if (STANDALONE) return;
    writeFields(preset.fields, limits.max_heads);
    Object.assign(state, { query: preset.select.query, queryText: null, head: preset.select.head,
      layer: preset.select.layer, bstage: null, step: null });
    schedule(0);
  }

  /** The preset buttons: the one whose request the inputs make is pressed. */
  function markPreset(body) {
    const on = presetOf(body)?.id ?? null;
    for (const b of ui.headPresets.querySelectorAll('button')) b.setAttribute('aria-pressed', String(b.dataset.preset === on));
  }

  /** The caption of the trace on screen (heads.js, captionFor): its preset's, or a line a constructed head. */
  function renderCaption() {
    const caption = state.main ? captionFor(state.main.body, (state.main.doc.full || state.main.doc).config) : null;
    ui.presetCaption.hidden = !caption;
    ui.presetCaption.dataset.preset = caption?.preset ?? '';
    setText(ui.presetCaptionTitle, caption ? caption.title : '');
    ui.presetCaptionBody.replaceChildren(...(caption ? caption.lines.map((line) => h('p', { text: line })) : []));
  }

  /** Set the form to `fields`; the head slider's top first (a range input clamps its value to it). */
  function writeFields(fields, headsMax) {
    ui.heads.max = String(headsMax);
    for (const [name, el] of controls) {
      if (el.type === 'checkbox') el.checked = fields[name];
      else el.value = fields[name];
    }
    ui.decode.checked = fields.decode;
    renderHeadKinds(headKinds(fields.head_weights, readInt(ui.heads.value) ?? 1));
  }

  /** A preset chosen: the mask and positions it sets outside the block join the inputs (url-state.js, PRESET_FIELDS). */
  function chooseBlockPreset() {
    const preset = PRESET_FIELDS[ui.block.value];
    if (preset) {
      ui.pe.value = preset.positional_encoding;
      ui.causal.checked = preset.causal;
    }
    schedule(0);
  }

  /** The request the inputs describe, or {errors} for what JSON cannot carry. */
  const readRequest = () => requestFrom(readFields());

  /** Set a node's text only when it changes (no mutation, nothing re-announced, when it does not). */
  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  /** The inputs the d_k card describes: d_model, h, the K/V heads and the scale switch. */
  const dkKey = () => JSON.stringify([ui.dModel.value.trim(), ui.heads.value, ui.kvHeads.value.trim(), ui.scale.checked]);

  /**
   * The d_k card from the inputs as typed, before the service answers: every number on it describes that one
   * configuration (never the last valid trace's), and a count that configuration does not have is "—".
   */
  function updateDkLive() {
    const card = dkCard(readFields(), limits.max_heads);
    ui.headsValue.value = String(card.heads ?? '');
    setText(ui.headsValue, String(card.heads ?? ''));
    setText(ui.dkDModel, card.shown.dModel);
    setText(ui.dkHeads, card.shown.heads);
    ui.ropeFields.hidden = ui.pe.value !== 'rope';
    setFactLabels(card.gqa, ui.scale.checked);
    setText(ui.dkValue, card.shown.dk);
    setText(ui.factMatrices, card.shown.matrices);
    setText(ui.factParams, card.shown.params);
    setText(ui.factScale, card.shown.scale);
    // The stack's totals (its FFN and norms) are the service's answer's: shown while the inputs still ask for it.
    const withoutSentence = (body) => JSON.stringify({ ...body, sentence: null });
    const stale = !state.main || withoutSentence(readRequest().body) !== withoutSentence(state.main.body);
    if (stale && !ui.factStack.hidden) ui.factStack.hidden = true; // (no mutation when nothing changes: the card stays put)
    if (card.sliderMax !== null && ui.heads.max !== String(card.sliderMax)) ui.heads.max = String(card.sliderMax);
    if (card.dModel !== null && ui.divisors.dataset.for !== String(card.dModel)) {
      ui.divisors.replaceChildren(...divisors(card.dModel, limits.max_heads).map((d) => h('option', { value: d, label: String(d) })));
      ui.divisors.dataset.for = String(card.dModel);
    }
    return card;
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
    for (const sel of headSelects()) sel.removeAttribute('aria-invalid');
    ui.heads.removeAttribute('aria-invalid');
  }

  /** Show a service message next to its field; /num_heads goes to the d_k card (the slider points at it). */
  function showFieldError(pointer, message) {
    if (pointer === '/num_heads') {
      ui.heads.setAttribute('aria-invalid', 'true');
      return true;
    }
    const placed = fieldError(pointer, uiWords(message), Object.keys(fieldErrors));
    if (!placed) return false;
    const node = fieldErrors[placed.field];
    node.hidden = false;
    node.textContent = node.textContent ? `${node.textContent}; ${placed.text}` : placed.text;
    fieldInputs[placed.field].setAttribute('aria-invalid', 'true');
    // A head's own problem (/head_weights/1) marks that head's choice too.
    const head = /^\/head_weights\/(\d+)$/.exec(pointer);
    if (head) $(`head-kind-${head[1]}`)?.setAttribute('aria-invalid', 'true');
    return true;
  }

  // ------------------------------------------------------------------ the address

  /** The view on screen, as url-state.js's hashFor takes it (the ablation only on the live page). */
  function viewNow() {
    const showStep = STANDALONE ? Array.isArray(state.main?.doc.decode) : ui.decode.checked;
    // A stack's layer and box, while the inputs (a saved page: its trace) ask for a stack.
    const stack = STANDALONE ? !!state.main && isStack(state.main.doc.full || state.main.doc) : ui.block.value !== '';
    return {
      query: state.query, head: state.head, step: showStep ? state.step : null, colour: state.colour,
      present: state.present, slide: state.slide, part: state.part, layer: stack ? state.layer : null, bstage: stack ? state.bstage : null,
      text: state.text,
      theme: state.theme,
      key: state.explain && state.explain.head === state.head && state.explain.query === state.query ? state.explain.key : null,
      ablate: STANDALONE ? null : state.ablate,
      ablateMlp: STANDALONE ? null : state.ablateMlp,
    };
  }

  /** The view into the address (a saved page's inputs are fixed: the selection only). */
  function writeHash() {
    const hash = hashFor(STANDALONE ? null : readFields(), viewNow());
    if (location.hash === hash) return;
    try {
      history.replaceState(null, '', hash);
    } catch {
      // A page in a sandboxed frame (a notebook shows a trace as the saved page in an iframe's srcdoc) has no address
      // of its own to write: the view lives on the page only.
    }
  }

  function readHash() {
    writeFields(fieldsFromHash(location.hash), limits.max_heads);
    readSelection();
  }

  /** The address's fragment; on a saved page opened without one, the view it was saved from (api.js, withView). */
  const addressHash = () => (location.hash.length > 1 || !EMBED?.view ? location.hash : `#${EMBED.view}`);

  /** The query token, head, decoding step, colour scale and present mode from the address. */
  function readSelection() {
    const { key, ...selection } = selectionFromHash(addressHash());
    Object.assign(state, { text: 1, theme: 'system', ablate: null, ablateMlp: null, part: null }, selection);
    if (STANDALONE) Object.assign(state, { ablate: null, ablateMlp: null }); // a saved page asks for no other trace
    state.pendingKey = key ?? null; // a shared link's clicked cell: explained once its trace is drawn
    state.queryText = null;
    ui.colourScale.value = state.colour;
    showTextScale();
    showPresentMode();
    showAblation();
  }

  // ------------------------------------------------------------------ asking the service

  async function loadLimits() {
    if (STANDALONE) return;
    try {
      const info = await getVersion();
      if (!info) return;
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

  async function refresh() {
    const { body, errors } = readRequest();
    const ablated = [
      ...(state.ablate ? [{ target: 'head_output', layer: state.ablate.layer, head: state.ablate.head }] : []),
      ...(state.ablateMlp !== null ? [{ target: 'mlp_output', layer: state.ablateMlp }] : [])];
    if (ablated.length) body.interventions = ablated;
    const seq = ++state.seq;
    if (state.controller) state.controller.abort();
    state.controller = null;
    writeHash();
    renderCurl(body);
    markPreset(body);
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
      atLayer(state.alt); // a stack's comparison, at the layer shown
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
    state.main = atLayer(main);
    state.gen = null; // a new answer: the panel starts again from its sentence
    state.generated = 0;
    showProblem(null);
    markStale(false);
    const cfg = main.doc.config;
    setDkState('valid', `${cfg.d_model} / ${cfg.num_heads} = ${cfg.d_k}: each head works in ${cfg.d_k} dimensions`, '');
    setFactLabels(cfg.num_kv_heads !== undefined, cfg.scale);
    setText(ui.dkValue, String(cfg.d_k));
    // One attention layer's counts beside its formulas; a stack's totals (config.n_matrices, n_parameters: every
    // layer's attention, FFN and norms) on their own labelled line.
    const kv = cfg.num_kv_heads ?? cfg.num_heads;
    setText(ui.factMatrices, String(cfg.num_heads + 2 * kv + 1));
    setText(ui.factParams, int(2 * cfg.d_model * cfg.d_model + 2 * kv * cfg.d_k * cfg.d_model));
    setText(ui.factScale, fmt(cfg.scale_factor, 4));
    const layers = cfg.num_layers ?? 1;
    const stack = isStack(main.doc.full || main.doc);
    if (ui.factStack.hidden === stack) ui.factStack.hidden = !stack; // only a change mutates the card
    if (stack) {
      setText(ui.factStackLabel, `The whole stack (${layers} layer${layers === 1 ? '' : 's'}, with FFN and norms)`);
      setText(ui.factStackValue, `${int(cfg.n_matrices)} matrices, ${int(cfg.n_parameters)} weights`);
    }
    ui.download.disabled = false;
    ui.downloadHtml.disabled = false;
    clearExplain('The inputs changed: click a cell (or press Enter on it) to explain it.');
    render();
    const key = state.pendingKey;
    state.pendingKey = null;
    if (Number.isInteger(key) && key < (main.doc.context_tokens || main.doc.tokens).length) {
      explainCell(state.head, state.query, key);
      select(null, null); // the maps mark the cell explained, the address keeps it
    }
    renderIntervention(main.doc.intervention);
  }

  /** Ablate the head on screen (zero its output, in its layer), or stop: the trace is asked for again. */
  function toggleAblation() {
    state.ablate = ui.ablateHead.checked ? { layer: state.layer ?? 0, head: state.head } : null;
    showAblation();
    schedule(0);
  }

  /** Ablate the MLP of the layer shown (zero its output), or stop. */
  function toggleMlpAblation() {
    state.ablateMlp = ui.ablateMlp.checked ? (state.layer ?? 0) : null;
    showAblation();
    schedule(0);
  }

  /** The ablation switches and their labels as the state has them (a click, or an address that names one). */
  function showAblation() {
    ui.ablateHead.checked = !!state.ablate;
    ui.ablateLabel.textContent = state.ablate ? `Ablated: layer ${state.ablate.layer}, head ${state.ablate.head}`
      : 'Ablate this head';
    ui.ablateMlp.checked = state.ablateMlp !== null;
    ui.ablateMlpLabel.textContent = state.ablateMlp !== null ? `Ablated: layer ${state.ablateMlp}'s MLP`
      : 'Ablate this layer\'s MLP';
  }

  /** What the ablation changed (the answer's intervention): its description and each stage's largest change. */
  function renderIntervention(iv) {
    ui.intervention.hidden = !iv;
    if (!iv) {
      ui.interventionBody.replaceChildren();
      return;
    }
    const rows = Object.entries(iv.max_abs_delta).filter(([, d]) => Array.isArray(d) ? d.some((x) => x > 0) : d > 0)
      .map(([sid, d]) => h('tr', { 'data-stage': sid }, [
        h('th', { scope: 'row', text: sid }),
        h('td', { text: (Array.isArray(d) ? d : [d]).map((x) => fmt(x, 4)).join(' · ') })]));
    const target = iv.target ? [h('p', { id: 'intervention-target', text: `Next token "${iv.target.token}": `
      + `${fmt(100 * iv.target.probability.baseline, 1)}% → ${fmt(100 * iv.target.probability.intervened, 1)}%`
      + ` (logit ${fmt(iv.target.logit.delta, 4)})` })] : [];
    ui.interventionBody.replaceChildren(
      ...iv.interventions.map((one) => h('p', { class: 'intervention-what', text: one.description })),
      ...target,
      h('table', { class: 'intervention-table' }, [
        h('thead', {}, [h('tr', {}, [h('th', { scope: 'col', text: 'stage' }),
          h('th', { scope: 'col', text: 'max |Δ| per layer' })])]),
        h('tbody', {}, rows)]));
  }

  /** A failed request: field messages inline, the rest in the alert; nothing else breaks. */
  function showError(err) {
    let title;
    let details = [];
    let unreachable = false;
    const dkMessages = [];
    if (err instanceof ServiceError && err.problem && typeof err.problem === 'object') {
      const p = err.problem;
      title = `${p.title || 'Error'} (HTTP ${p.status || err.status})`;
      const items = Array.isArray(p.errors) ? p.errors : [];
      for (const item of items) {
        const pointer = item.pointer || '';
        const message = item.message || p.detail || '';
        if (pointer === '/num_heads') dkMessages.push(uiWords(message));
        showFieldError(pointer, message);
        details.push(`${pointer ? uiWords(pointer.slice(1)) : 'request'}: ${uiWords(message)}`);
      }
      if (!items.length) details.push(uiWords(p.detail || err.text || `HTTP ${err.status}`));
    } else if (err instanceof ServiceError) {
      title = `The service answered HTTP ${err.status} without a problem document`;
      details = [String(err.text || '').slice(0, 300) || 'empty body'];
    } else {
      title = 'Could not reach the service';
      details = [`${err?.message || err}. Is it running? Change an input (or press Enter) to ask again.`];
      unreachable = true;
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
    markStale(true, unreachable ? 'The service is not answering: the numbers update when it is back.'
      : dkMessages.length ? 'Pick a head count that divides d_model to update.' : 'Change the inputs to update.');
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

  // ------------------------------------------------------------------ drawing and selecting

  /** The trace on screen, drawn whole: the selection kept (or clamped), the pickers, every section. */
  function render() {
    atLayer(state.main); // the layer the selection asks for (a saved page's address may have changed it)
    atLayer(state.alt);
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
    if (Number.isInteger(doc.layer)) state.layer = doc.layer; // clamped to the stack by layerView
    writeHash();
    renderPickers();
    renderCaption();
    renderSelection();
    showSlide();
    renderStatus();
    renderFooter();
  }

  /** Another query token or head (null: keep it): the address, the pickers and what depends on them. */
  function select(query, head, { focus } = {}) {
    if (!state.main) return;
    if (query !== null) {
      state.query = query;
      state.queryText = state.main.doc.tokens[query].text;
    }
    if (head !== null) state.head = head;
    writeHash();
    syncPickers();
    renderSelection();
    showSlide();
    if (focus) focus();
  }

  /** A trace ({doc, …}) drawn at the chosen layer: its doc is that layer of the answer (the answer itself, doc.full). */
  function atLayer(t) {
    if (!t) return t;
    t.doc = layerView(t.doc.full || t.doc, state.layer ?? 0);
    return t;
  }

  /** Another layer of the stack on screen: every per-layer section redrawn from the same answer, no request. */
  function selectLayer(layer) {
    if (!state.main || layer === state.main.doc.layer) return;
    state.layer = layer;
    atLayer(state.main);
    atLayer(state.alt);
    clearExplain(`Layer ${state.main.doc.layer} shown: click a cell (or press Enter on it) to explain it.`);
    writeHash();
    syncPickers();
    renderSelection();
    renderStatus();
    showSlide();
  }

  /** A box of the block's diagram chosen: its stages shown (and the box highlighted), no request. */
  function selectBox(id, { focus = false } = {}) {
    if (!state.main) return;
    state.bstage = id;
    writeHash();
    renderBlock();
    if (focus) ui.blockDiagram.querySelector(`[data-box="${id}"]`)?.focus();
  }

  // ------------------------------------------------------------------ present mode

  /** Present mode on or off as state.present says: the page's class, the bar, the button, the slide. */
  function showPresentMode() {
    document.documentElement.classList.toggle('is-present', state.present);
    ui.presentBar.hidden = !state.present;
    ui.presentToggle.setAttribute('aria-pressed', String(state.present));
    ui.presentToggle.textContent = state.present ? 'End present mode' : 'Present';
    showSlide();
  }

  /** Draw the slide in state.slide (render.js sets the rest of the page aside), fit it and say where it is. */
  function showSlide() {
    presentShown = renderPresent();
    fitSlide();
  }

  // The slide renderPresent drew last ({slides, at}, or null out of present mode), and its figures as fitSlide found
  // them: one step (the whole slide) when it fits at a projector's text size, else one step a figure.
  let presentShown = null;
  let presentSteps = { count: 1, labels: [], part: 0 };

  /** The bar: the stage, and the figure of it on screen when the stage is shown one figure at a time. */
  function sayWhere() {
    if (!presentShown) return;
    const { slides, at } = presentShown;
    state.slide = slides[at].id;
    const { count, labels, part } = presentSteps;
    ui.presentTitle.textContent = `Stage ${at + 1} of ${slides.length}: ${slides[at].title}`;
    ui.presentPart.textContent = count > 1 ? ` — ${labels[part]} (${part + 1} of ${count})` : '';
    ui.presentPrev.disabled = at === 0 && part === 0;
    ui.presentNext.disabled = at === slides.length - 1 && part === count - 1;
  }

  // A slide's zoom: as large as fits the screen above the bar, within these bounds (a projector's 1280×720 shows a
  // 3-token stage at about 1.5; a 1920×1080 screen a 3-token one at the top). Below PRESENT_ZOOM_MIN only a figure
  // that has neither numbers nor captions goes.
  const PRESENT_ZOOM_MIN = 0.35;
  const PRESENT_ZOOM_MAX = 2;
  // A projector's text: a map's or a matrix's numbers (and the √d_k comparison's weights, entropy and max weight)
  // at least 16 screen pixels, a figure's caption at least 20.
  const PRESENT_NUMBER_PX = 16;
  const PRESENT_CAPTION_PX = 20;
  const PRESENT_NUMBERS = '.hm-cell, .mx-cell, .rs-cell, .compare-table .num';
  const PRESENT_CAPTIONS = 'figcaption, .mx-caption, #walkthrough-title';
  let fitting = false;

  /** The smallest zoom at which the slide's numbers and captions keep a projector's sizes (3 decimals, rounded up). */
  function zoomFloor() {
    let floor = PRESENT_ZOOM_MIN;
    const need = (selector, px) => {
      for (const el of ui.results.querySelectorAll(selector)) {
        if (el.offsetParent === null || !el.textContent.trim()) continue;
        floor = Math.max(floor, px / parseFloat(getComputedStyle(el).fontSize));
      }
    };
    need(PRESENT_NUMBERS, PRESENT_NUMBER_PX);
    need(PRESENT_CAPTIONS, PRESENT_CAPTION_PX);
    return Math.ceil(floor * 1000 - 1e-6) / 1000;
  }

  /**
   * The figures of the slide on screen, in the page's order, each {label, part, els}: the matrices' tables one by
   * one, a map, every head's thumbnails, the block's diagram and each of its stage's tables, and every other part
   * whole. What present mode steps through when the slide is too busy for a projector's text.
   */
  function slideFigures() {
    const on = (el) => !!el && el.offsetParent !== null;
    // A label as it reads on screen (a title's screen-reader twin left out).
    const seen = (el) => {
      if (!el) return '';
      const copy = el.cloneNode(true);
      for (const hidden of copy.querySelectorAll('.visually-hidden')) hidden.remove();
      return copy.textContent;
    };
    const figures = [];
    const parts = [...ui.results.children].filter((el) => el.dataset.present && on(el))
      .sort((a, b) => Number(getComputedStyle(a).order) - Number(getComputedStyle(b).order));
    for (const part of parts) {
      const add = (label, els) => figures.push({ label: (label || '').replace(/\s+/g, ' ').trim(), part, els });
      if (part.contains(ui.matrices)) {
        for (const t of ui.matrices.querySelectorAll('table.mx-grid')) {
          if (on(t)) add(seen(t.querySelector('.mx-caption')).split(':')[0], [t]);
        }
      } else if (part.dataset.present === 'maps') {
        for (const f of part.querySelectorAll('figure.heatmap')) if (on(f)) add(seen(f.querySelector('.hm-title')), [f]);
        if (on(ui.thumbs)) add('every head', [ui.thumbs]);
      } else if (part.dataset.present === 'block') {
        const diagram = ui.blockDiagram.parentElement;
        if (on(diagram)) add('the block\'s diagram', [diagram]);
        for (const p of ui.blockStage.querySelectorAll('.bs-part')) {
          if (on(p)) add(seen(p.querySelector('.bs-title') || p.querySelector('.mx-caption')), [p]);
        }
      } else {
        add(part.dataset.present === 'walkthrough' ? 'the walkthrough' : seen(part.querySelector('h2')), [part]);
      }
    }
    return figures;
  }

  /** Everything a previous fit set aside or cut, back. */
  function clearFigureSteps() {
    for (const el of ui.results.querySelectorAll('.present-aside, .present-cut')) el.classList.remove('present-aside', 'present-cut');
    for (const el of ui.results.querySelectorAll('.present-slice-note')) el.remove();
    ui.results.classList.remove('present-one');
  }

  /** One figure of the slide on screen, the others (and the parts with none of it) set aside. */
  function showFigure(figures, i) {
    const shown = figures[i];
    ui.results.classList.add('present-one');
    for (const f of figures) {
      if (f === shown) continue;
      for (const el of f.els) el.classList.add('present-aside');
      if (f.part !== shown.part) f.part.classList.add('present-aside');
    }
    // The matrices' "·" and "=" between the tables go with the others.
    if (shown.part.contains(ui.matrices)) for (const op of ui.matrices.querySelectorAll('.mx-op')) op.classList.add('present-aside');
  }

  /**
   * A figure too large for the screen even alone at a projector's text size: its largest table cut to the first
   * columns, then the first rows, that fit, with a note that says which (the whole table is in the page).
   */
  function sliceFigure(figure, fitsWide, fitsTall) {
    const tables = figure.els.flatMap((el) => (el.matches('table') ? [el] : [...el.querySelectorAll('table')]))
      .filter((t) => t.offsetParent !== null && t.tBodies.length);
    const table = tables.sort((a, b) => b.querySelectorAll('td').length - a.querySelectorAll('td').length)[0];
    if (!table) return;
    const rows = [...table.tBodies[0].rows];
    const allRows = [...table.rows];
    const nCols = Math.max(0, ...rows.map((r) => r.cells.length - 1));
    const matrix = table.dataset.matrix;
    const colNoun = matrix === 'KT' || matrix === 'scores' || table.classList.contains('hm-grid') ? 'keys'
      : matrix === 'Q' || table.classList.contains('bs-grid') ? 'dimensions' : table.querySelector('.rs-cell') ? 'depths' : 'columns';
    const rowNoun = matrix === 'KT' ? 'dimensions' : table.classList.contains('hm-grid') || matrix === 'scores' ? 'queries' : 'tokens';
    const note = document.createElement('p');
    note.className = 'hint present-slice-note';
    (table.closest('.mx-scroll, .hm-scroll, .table-scroll') || table).after(note);
    let cols = nCols;
    let keep = rows.length;
    const cut = () => {
      for (const r of allRows) [...r.cells].forEach((c, j) => c.classList.toggle('present-cut', j > cols));
      rows.forEach((r, i) => r.classList.toggle('present-cut', i >= keep));
      const said = [cols < nCols ? `${colNoun} 1–${cols} of ${nCols}` : '', keep < rows.length ? `${rowNoun} 1–${keep} of ${rows.length}` : '']
        .filter(Boolean).join(', ');
      note.textContent = `Showing ${said || 'all of it'}; the full table is in the page (Esc ends present mode).`;
    };
    // The most columns that fit the width, then the most rows that fit the height (bisection: a layout a guess).
    const most = (n, ok) => {
      let lo = 1;
      let hi = n;
      while (lo < hi) {
        const mid = Math.ceil((lo + hi) / 2);
        if (ok(mid)) lo = mid;
        else hi = mid - 1;
      }
      return lo;
    };
    cut();
    if (!fitsWide()) cols = most(nCols, (k) => { cols = k; cut(); return fitsWide(); });
    cut();
    if (!fitsTall()) keep = most(rows.length, (k) => { keep = k; cut(); return fitsTall(); });
    cut();
  }

  /**
   * Present mode: the slide (#main, the pickers and the stage's parts) zoomed (CSS zoom, so it lays out again) to fill
   * the screen above the bar without scrolling: down when it is too tall or too wide, up on a larger screen, but
   * never below the zoom that keeps its numbers at 16 px and its captions at 20 (zoomFloor). A slide that does not
   * fit at that zoom is shown one figure a step (state.part; the clicker walks through them before the next stage),
   * and a figure too large even alone is cut to the columns and rows that fit, with a note. Out of present mode, no
   * zoom.
   */
  function fitSlide() {
    const root = document.documentElement;
    if (!state.present || !state.main) {
      root.style.removeProperty('--present-zoom');
      delete root.dataset.presentZoom;
      clearFigureSteps();
      presentSteps = { count: 1, labels: [], part: 0 };
      return;
    }
    if (fitting) return;
    fitting = true;
    try {
      clearFigureSteps();
      root.style.setProperty('--present-bar', `${Math.ceil(ui.presentBar.getBoundingClientRect().height)}px`);
      const zoomTo = (z) => root.style.setProperty('--present-zoom', String(z));
      // Whether the slide fits at the zoom set: its height above the bar, and no figure wider than its scroll box.
      const fitsTall = () => {
        const bottom = Math.max(...[ui.main, ...ui.main.children, ...ui.results.children]
          .filter((el) => el.offsetParent !== null).map((el) => el.getBoundingClientRect().bottom));
        return bottom + window.scrollY <= ui.presentBar.getBoundingClientRect().top - 6;
      };
      const fitsWide = () => [ui.main, ...ui.results.querySelectorAll('.hm-scroll, .mx-scroll, .table-scroll')]
        .every((el) => el.offsetParent === null || el.scrollWidth <= el.clientWidth + 1);
      const fits = (z) => {
        zoomTo(z);
        return fitsTall() && fitsWide();
      };
      // The largest zoom from `lo` up that fits, by bisection (a zoomed slide wraps its lines in another width, so no
      // formula), a little below it and checked again (a line can wrap at one zoom and not at the next); `lo` itself
      // when nothing above it fits.
      const largest = (from) => {
        let lo = from;
        let hi = PRESENT_ZOOM_MAX;
        if (fits(hi)) lo = hi;
        for (let i = 0; i < 9 && hi - lo > 0.01; i += 1) {
          const mid = (lo + hi) / 2;
          if (fits(mid)) lo = mid;
          else hi = mid;
        }
        let zoom = Math.max(from, Math.floor(lo * 0.97 * 1000) / 1000);
        while (!fits(zoom) && zoom > from) zoom = Math.max(from, Math.floor(zoom * 0.95 * 1000) / 1000);
        return zoom;
      };
      let floor = zoomFloor();
      let zoom;
      const figures = fits(floor) ? [] : slideFigures();
      // The figure asked for (state.part, from the address or a step; −1: the last) is kept as asked while the slide
      // fits whole: a slide drawn before its comparison arrives may fit, and split once it has.
      if (figures.length > 1) {
        const asked = state.part ?? 0;
        const part = asked < 0 ? figures.length - 1 : Math.min(asked, figures.length - 1);
        if (asked < 0) state.part = part;
        presentSteps = { count: figures.length, labels: figures.map((f) => f.label), part };
        showFigure(figures, part);
        floor = zoomFloor(); // the figure's own: one without numbers or captions (a diagram, a text) may go lower
      } else {
        presentSteps = { count: 1, labels: [], part: 0 };
      }
      if (fits(floor)) zoom = largest(floor);
      else {
        // Too large even alone: as many of its table's columns and rows as fit at the floor; anything else (no
        // table to cut) as small as it has to be.
        zoomTo(floor);
        const shown = figures.length > 1 ? figures[presentSteps.part] : { els: [...ui.results.children].filter((el) => el.offsetParent !== null) };
        sliceFigure(shown, fitsWide, fitsTall);
        zoom = fits(floor) ? floor : largest(PRESENT_ZOOM_MIN);
      }
      zoomTo(zoom);
      root.dataset.presentZoom = String(zoom);
    } finally {
      fitting = false;
    }
    sayWhere();
  }

  function setPresent(on) {
    if (state.present === on) return;
    state.present = on;
    if (!on) {
      state.slide = null;
      state.part = null;
    }
    showPresentMode();
    writeHash();
    window.scrollTo(0, 0);
    (on ? ui.presentNext : ui.presentToggle).focus({ preventScroll: true });
  }

  /**
   * The next (+1) or previous (−1) step: the slide's next figure while it is shown one figure at a time, else the
   * next slide (its first figure; going back, its last).
   */
  function step(by) {
    const shown = renderPresent();
    if (!shown) return;
    const part = presentSteps.part + by;
    if (part >= 0 && part < presentSteps.count) {
      state.part = part;
    } else {
      const at = Math.min(Math.max(shown.at + by, 0), shown.slides.length - 1);
      if (at === shown.at) return;
      state.slide = shown.slides[at].id;
      state.part = by < 0 ? -1 : 0; // going back: the slide's last figure (fitSlide knows how many it has)
    }
    showSlide();
    writeHash();
    window.scrollTo(0, 0);
  }

  /**
   * Keys in present mode: Page Down / Page Up (a presenter's clicker), the arrows and the space bar (Shift+Space back)
   * outside the controls that use them, Escape. A focused button keeps its own Space (it clicks it).
   */
  function presentKeys(e) {
    if (!state.present || e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target;
    const inControl = t instanceof Element && t.closest('input, select, textarea, [role="grid"], summary, .chips, .bd-box')
      && !t.closest('#present-bar');
    const onButton = t instanceof Element && !!t.closest('button, [role="button"], a[href]');
    const space = e.key === ' ' && !inControl && !onButton;
    if (e.key === 'Escape') setPresent(false);
    else if (e.key === 'PageDown' || (space && !e.shiftKey) || (!inControl && (e.key === 'ArrowRight' || e.key === 'ArrowDown'))) step(1);
    else if (e.key === 'PageUp' || (space && e.shiftKey) || (!inControl && (e.key === 'ArrowLeft' || e.key === 'ArrowUp'))) step(-1);
    else return;
    e.preventDefault();
  }

  // ------------------------------------------------------------------ actions

  /** The saturation section's demonstration: the sentence kept, d_model 64 and one head (d_k 64). */
  function demo() {
    if (STANDALONE) return;
    ui.dModel.value = '64';
    updateDkLive(); // the head slider's range follows d_model first
    ui.heads.value = '1';
    resizeHeadKinds(); // one kind choice for the one head
    state.head = 0;
    schedule(0);
  }

  /** The text scale on the page (a CSS variable every font size follows) and in its control. */
  function showTextScale() {
    ui.textScale.value = String(state.text);
    ui.theme.value = state.theme;
    if (state.theme === 'system') delete document.documentElement.dataset.theme;
    else document.documentElement.dataset.theme = state.theme;
    document.documentElement.style.setProperty('--text-scale', String(state.text));
  }

  /** A text scale chosen: the page redrawn at it (maps fit their boxes again, a slide the screen). */
  function setTextScale() {
    state.text = Number(ui.textScale.value) || 1;
    showTextScale();
    writeHash();
    if (state.main) {
      renderer.markOverflow();
      fitSlide();
    }
  }

  /** The maps' colour scale chosen. */
  function setColour() {
    state.colour = ui.colourScale.value;
    writeHash();
    if (state.main) {
      renderSelection();
      showSlide();
    }
  }

  function renderCurl(body) {
    ui.curl.textContent = curlFor(body, { saved: STANDALONE, href: location.href });
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

  /** The file name of an export of the trace on screen (service/offline_page.py names the HTML file alike). */
  const exportNameOnScreen = () => exportName(state.main.doc, state.main.body);

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
    const name = `${exportNameOnScreen()}.json`;
    saveBlob(new Blob([state.main.text], { type: 'application/json' }), name);
    ui.actionStatus.textContent = `Saved ${name} (the exact response, every float in full).`;
  }

  /**
   * The request "Download HTML" sends: the trace on screen's, and when the next-token panel has appended k > 0
   * tokens, the generation fields its step asked with (generate: k, and the temperature, sample_seed, top_k and
   * top_p it sent), so that the saved page's panel walks the same k steps (the service draws the same tokens for
   * the same request, a shorter generation being the longer one's first steps). Never `stages`: the page draws
   * every stage (/trace/html refuses it).
   */
  function htmlRequestBody() {
    const body = state.main.body;
    const gen = STANDALONE ? null : state.gen;
    const k = gen?.doc ? Math.min(state.generated, gen.doc.generation.length) : 0;
    if (k === 0) return body;
    const asked = ['temperature', ...OPTION_INPUTS.map(([f]) => f.name)].filter((name) => name in gen.request)
      .map((name) => [name, gen.request[name]]);
    return { ...body, ...Object.fromEntries(asked), generate: k };
  }

  /** The service's one-file offline page of the trace on screen (POST /trace/html). */
  async function downloadHtml() {
    if (!state.main || STANDALONE) return;
    ui.downloadHtml.disabled = true;
    ui.actionStatus.textContent = 'Making the HTML file…';
    try {
      const { blob, name: given } = await postHtml(htmlRequestBody());
      const name = given || `${exportNameOnScreen()}.html`;
      // The file opens on this view (the text scale, the theme, the query, head, layer, clicked cell …) without an
      // address: the selection, as a saved page's address holds it, written into the file as data.
      const { ablate, ablateMlp, ...view } = viewNow();
      saveBlob(new Blob([withView(await blob.text(), hashFor(null, view))], { type: blob.type || 'text/html' }), name);
      ui.actionStatus.textContent = `Saved ${name}: this view in one file that opens offline.`;
    } catch (err) {
      ui.actionStatus.textContent = `Could not make the HTML file: ${err?.message || err}`;
    } finally {
      ui.downloadHtml.disabled = !state.main;
    }
  }

  /**
   * Save an SVG drawing as a PNG at 2× (a projector's slide): the SVG drawn on a canvas through a data: URL (the
   * page's CSP allows data: images, a saved page's too), on white.
   */
  async function downloadPng(root, name) {
    const text = typeof root === 'string' ? root : svgFile(root);
    const size = (attr) => Number((text.match(new RegExp(`<svg[^>]*\\s${attr}="([\\d.]+)"`)) || [])[1]);
    const [w, h] = [size('width'), size('height')];
    const img = new Image();
    try {
      // The bytes as a binary string a slice at a time: one call's arguments cannot hold a large figure's
      // (4 heads of 12 tokens is some 140 kB).
      const bytes = new TextEncoder().encode(text);
      let binary = '';
      for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
      img.src = `data:image/svg+xml;base64,${btoa(binary)}`;
      await img.decode();
      const canvas = document.createElement('canvas');
      canvas.width = Math.round(2 * w);
      canvas.height = Math.round(2 * h);
      const ctx = canvas.getContext('2d');
      ctx.fillStyle = '#ffffff';
      ctx.fillRect(0, 0, canvas.width, canvas.height);
      ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
      const blob = await new Promise((resolve) => { canvas.toBlob(resolve, 'image/png'); });
      saveBlob(blob, name);
      ui.actionStatus.textContent = `Saved ${name} (${canvas.width} × ${canvas.height} px, 2× for a projector).`;
    } catch (err) {
      ui.actionStatus.textContent = `Could not make ${name}: ${err?.message || err}`;
    }
  }

  /**
   * The block's diagram on screen as a stand-alone SVG file: its shapes with their computed colours and fonts written
   * in (the page draws them with style.css's classes), under a heading with the layer and the sentence.
   */
  function diagramFile() {
    const svg = ui.blockDiagram.querySelector('svg');
    if (!svg || !state.main) return null;
    const copy = svg.cloneNode(true);
    const from = [svg, ...svg.querySelectorAll('*')];
    const to = [copy, ...copy.querySelectorAll('*')];
    const props = ['fill', 'stroke', 'stroke-width', 'stroke-dasharray', 'font-size', 'font-weight', 'font-style', 'font-family'];
    from.forEach((el, i) => {
      const cs = getComputedStyle(el);
      for (const p of props) if (cs.getPropertyValue(p)) to[i].setAttribute(p, cs.getPropertyValue(p));
      for (const a of ['class', 'tabindex', 'role', 'aria-pressed', 'aria-label']) to[i].removeAttribute(a);
    });
    const [, , w, h] = svg.getAttribute('viewBox').split(' ').map(Number);
    const sentence = typeof state.main.body.sentence === 'string' ? state.main.body.sentence : state.main.doc.tokens.map((t) => t.text).join(' ');
    const ns = 'http://www.w3.org/2000/svg';
    const group = document.createElementNS(ns, 'g');
    group.setAttribute('transform', 'translate(0 44)');
    group.append(...copy.childNodes);
    const heading = (text) => Object.assign(document.createElementNS(ns, 'text'), { textContent: text });
    const title = heading(ui.blockTitle.textContent);
    const line = heading(`“${sentence}”`);
    [[title, 18, 14, 700], [line, 36, 12, 400]].forEach(([t, y, size, weight]) => {
      for (const [k, v] of Object.entries({ x: 8, y, 'font-size': size, 'font-weight': weight, fill: '#16191f', 'font-family': 'sans-serif' })) t.setAttribute(k, v);
    });
    const width = Math.max(w, 8 + 7 * Math.max(title.textContent.length, line.textContent.length));
    copy.setAttribute('xmlns', ns);
    copy.setAttribute('viewBox', `0 0 ${width} ${h + 44}`);
    copy.setAttribute('width', String(width));
    copy.setAttribute('height', String(h + 44));
    const bg = document.createElementNS(ns, 'rect');
    for (const [k, v] of Object.entries({ x: 0, y: 0, width: '100%', height: '100%', fill: '#ffffff' })) bg.setAttribute(k, v);
    copy.append(bg, title, line, group);
    return `<?xml version="1.0" encoding="UTF-8"?>\n${new XMLSerializer().serializeToString(copy)}\n`;
  }

  function downloadDiagram(png) {
    const text = diagramFile();
    if (!text) return;
    const name = `${exportNameOnScreen()}_block_layer${state.main.doc.layer ?? 0}`;
    if (png) downloadPng(text, `${name}.png`);
    else {
      saveBlob(new Blob([text], { type: 'image/svg+xml' }), `${name}.svg`);
      ui.actionStatus.textContent = `Saved ${name}.svg.`;
    }
  }

  /** Save an SVG drawing (svg.js's element tree) as a file. */
  function downloadSvg(root, name) {
    saveBlob(new Blob([svgFile(root)], { type: 'image/svg+xml' }), name);
    ui.actionStatus.textContent = `Saved ${name}.`;
  }

  function downloadComparisonSvg(png = false) {
    if (!state.main || !state.alt || state.altPending) return;
    const sentence = typeof state.main.body.sentence === 'string' ? state.main.body.sentence : null;
    const root = comparisonSvg(state.main.doc, state.alt.doc, { query: state.query, head: state.head, sentence });
    const name = `${exportNameOnScreen()}_comparison_q${state.query}_head${state.head}`;
    if (png) downloadPng(root, `${name}.png`);
    else downloadSvg(root, `${name}.svg`);
  }

  // ------------------------------------------------------------------ wiring

  // ------------------------------------------------------------------ generating (the next-token panel)

  /** The first request of a live page's generation asks for this many tokens (or the limit, when fewer). */
  const GENERATE_CHUNK = 8;

  /**
   * The request a live page's generate step sends, without its `generate`: the trace's own request as on screen
   * (so its answer's trace is the one shown), at the panel's temperature, with the panel's sample_seed, top_k and
   * top_p, and `stages: ["next_token_probs"]`, since the panel reads only the answer's generation: the numbers
   * are the same, the bytes ~60 times fewer. `decode` is left out (its numbers are already on screen).
   */
  function generationRequest() {
    const { decode, ...body } = state.main.body;
    const full = state.main.doc.full || state.main.doc;
    const T = state.temperature ?? full.config.temperature;
    const options = OPTION_INPUTS.filter(([, input]) => input.value.trim() !== '')
      .map(([f, input]) => [f.name, Number(input.value)]);
    return {
      ...body,
      ...(T !== full.config.temperature ? { temperature: T } : {}),
      stages: ['next_token_probs'],
      ...Object.fromEntries(options), // the panel's sample_seed, top_k and top_p, as given
    };
  }

  /**
   * "Generate a token". A saved page walks its answer's generation (no request). The live page asks the service:
   * POST /trace with `generate`, first for GENERATE_CHUNK tokens, then, once the button has walked past them, for
   * twice as many as it holds (up to the limit: generate's maximum in fields.js and max_tokens minus the sentence), each
   * answer holding every step from the first (the service keeps nothing between requests; the same request draws
   * the same tokens). A press within the answer held sends nothing. Measured (docs/viewer.md): a request's cost
   * is mostly the trace and the sentence's decoding, each new token ~8% of that at teaching sizes, so one request
   * a press would cost ~N times the trace, and one request for all 64 up to 76% of the request-cost budget for the
   * few tokens a lecture shows. A request the budget refuses for more tokens than the press needs is asked again
   * for just those; a refusal is said in the panel. Changing the temperature, the seed, top_k or top_p changes
   * the request: the next press asks again.
   */
  async function generateStep() {
    if (STANDALONE) {
      state.generated += 1;
      renderNextToken();
      return;
    }
    if (!state.main || state.gen?.pending) return;
    const base = generationRequest();
    const key = JSON.stringify(base);
    const n = (state.main.doc.full || state.main.doc).tokens.length;
    if (state.gen?.key !== key) {
      state.gen = { key, request: base, limit: Math.min(MAX_GENERATE, limits.max_tokens - n), doc: null,
        error: null, pending: false };
    }
    const gen = state.gen;
    const want = state.generated + 1;
    const have = gen.doc ? gen.doc.generation.length : 0;
    if (want <= have) {
      state.generated = want;
      renderNextToken();
      return;
    }
    let ask = Math.max(Math.min(gen.limit, Math.max(GENERATE_CHUNK, 2 * have)), want);
    gen.pending = true;
    gen.error = null;
    renderNextToken();
    try {
      let answer;
      try {
        answer = await postJson(ENDPOINTS.trace, { ...base, generate: ask });
      } catch (err) {
        const tooLarge = err instanceof ServiceError && (err.problem?.errors || []).some((e) => e.type === 'trace_too_large');
        if (!tooLarge || ask === want) throw err;
        ask = want; // more tokens than this press needs were over the budget: ask for just what it needs
        answer = await postJson(ENDPOINTS.trace, { ...base, generate: ask });
      }
      if (state.gen !== gen) return; // a new trace, or another way of choosing, since
      gen.doc = answer.doc;
      state.generated = want;
    } catch (err) {
      if (state.gen !== gen) return;
      gen.error = err;
    } finally {
      gen.pending = false;
    }
    renderNextToken();
  }

  function init() {
    ui.colourScale.addEventListener('change', setColour);
    ui.textScale.addEventListener('change', setTextScale);
    ui.ablateHead.addEventListener('change', toggleAblation);
    ui.ablateMlp.addEventListener('change', toggleMlpAblation);
    ui.theme.addEventListener('change', () => {
      state.theme = ui.theme.value;
      showTextScale();
      writeHash();
    });
    ui.presentToggle.addEventListener('click', () => setPresent(!state.present));
    ui.presentExit.addEventListener('click', () => setPresent(false));
    ui.presentNext.addEventListener('click', () => step(1));
    ui.presentPrev.addEventListener('click', () => step(-1));
    document.addEventListener('keydown', presentKeys);
    window.addEventListener('resize', () => {
      if (!state.main) return;
      renderer.markOverflow();
      fitSlide();
    });
    // A slide's content can change after it is drawn (the comparison arrives, a cell is explained): fit it again.
    if (typeof ResizeObserver === 'function') new ResizeObserver(() => fitSlide()).observe(ui.results);
    ui.copy.addEventListener('click', copyCurl);
    ui.download.addEventListener('click', downloadJson);
    ui.downloadHtml.addEventListener('click', downloadHtml);
    ui.saturationSvg.addEventListener('click', () => downloadComparisonSvg(false));
    ui.saturationPng.addEventListener('click', () => downloadComparisonSvg(true));
    ui.blockSvg.addEventListener('click', () => downloadDiagram(false));
    ui.blockPng.addEventListener('click', () => downloadDiagram(true));
    ui.lmTemperature.addEventListener('input', () => { // the bars redrawn from the answer's logits: no request
      state.temperature = Number(ui.lmTemperature.value);
      renderNextToken();
    });
    ui.lmGenerate.addEventListener('click', generateStep);
    ui.lmGenerateReset.addEventListener('click', () => { // back to the sentence; the steps asked for stay, to walk again
      state.generated = 0;
      renderNextToken();
    });
    for (const [, input] of OPTION_INPUTS) {
      input.addEventListener('change', () => { // another way of choosing: the next press asks again, from the sentence
        if (!state.gen) return; // (an answer on its way is dropped when it arrives: generateStep sees another state.gen)
        state.gen = null;
        state.generated = 0;
        renderNextToken();
      });
    }
    ui.decodeStep.addEventListener('input', () => {
      if (!state.main) return;
      state.step = Number(ui.decodeStep.value);
      writeHash();
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
    ui.block.addEventListener('change', chooseBlockPreset);
    ui.headPresets.replaceChildren(...PRESETS.map((p) => h('button', {
      type: 'button', class: 'button button-small', 'aria-pressed': 'false', data: { preset: p.id }, text: p.label,
      onclick: () => choosePreset(p),
    })));
    // Text and numbers ask for a trace once the typing stops, choices and switches at once; the head slider and
    // the block's preset have their own.
    for (const [, input] of controls) {
      if (input === ui.heads || input === ui.block) continue;
      const typed = input.tagName !== 'SELECT' && input.type !== 'checkbox';
      input.addEventListener(typed ? 'input' : 'change', () => schedule(typed ? DEBOUNCE_MS : 0));
    }
    ui.heads.addEventListener('input', () => {
      resizeHeadKinds();
      schedule(SLIDER_DEBOUNCE_MS);
    });
    ui.decode.addEventListener('change', () => schedule(0));
    window.addEventListener('hashchange', () => {
      readHash();
      schedule(0);
    });
    loadLimits();
    schedule(0);
  }

  // ------------------------------------------------------------------ a saved trace (service/offline_page.py)

  /** The inputs show the configuration the trace was made with; the page draws it without the service. */
  function initStandalone() {
    document.documentElement.classList.add('is-standalone');
    for (const el of document.querySelectorAll('[data-service-only]')) el.hidden = true;
    for (const el of document.querySelectorAll('[data-standalone-only]')) el.hidden = false;
    const { request, doc } = EMBED;
    const cfg = doc.config;
    writeFields(fieldsFromTrace(request, doc), Math.max(cfg.num_heads, cfg.d_model));
    for (const el of ui.form.elements) el.disabled = true; // nothing here can ask the service for another trace
    readSelection();
    // A preset's trace (the command line's --html of a preset's request too) opens on the view its caption is about,
    // unless the address chose one.
    const preset = presetOf(request, cfg);
    if (preset && !/[#&](q|head|layer)=/.test(addressHash())) {
      Object.assign(state, { query: preset.select.query, head: preset.select.head, layer: preset.select.layer });
    }
    updateDkLive();
    state.alt = EMBED.comparison ? atLayer({ doc: EMBED.comparison, text: null, body: comparisonBody(request), ms: null }) : null;
    showTrace({ doc, text: EMBED.text, body: request, ms: null });
    renderCurl(request);
    ui.main.setAttribute('aria-busy', 'false');
    window.addEventListener('hashchange', () => {
      readSelection();
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
