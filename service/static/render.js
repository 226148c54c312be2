/*
 * attention-trace viewer: drawing a trace into the page, section by section.
 *
 * The status line and the footer, the walkthrough (one query token, one head, stage by stage), the attention maps
 * and every head's thumbnail, the shared K/V heads, KV-cache decoding, the scaled/unscaled comparison, concat vs
 * average, the query token, head and layer pickers, and a stack's block (its diagram, as SVG, and the stage shown) and
 * residual stream. The DOM is built with createElement/textContent only (h below:
 * no HTML string is ever parsed, so a sentence cannot inject markup), and cells are coloured through CSS custom
 * properties set with the CSSOM.
 *
 * app.js calls create(view) once with what the sections read and call: view.state (the trace on screen and the
 * selection), view.ui (the page's elements), view.saved (a saved page) and view.actions (select, explainCell,
 * downloadSvg, downloadPng, selectLayer, selectBox, which belong to app.js and explain.js). The stateless builders (h, vec …) are
 * shared with them. A stack's chosen layer is drawn from state.main.doc, which app.js sets to that layer
 * (trace.js's layerView); state.main.doc.full is the whole answer.
 *
 * Adds `render` to globalThis.AttentionTrace (after format.js, trace.js, svg.js and block.js).
 */
'use strict';

(() => {
  const { fmt, pct, int, quoted, fmtBase, extent, unit, norm, mapScale, subscript, ON_DARK_AT } = globalThis.AttentionTrace.format;
  const { HEATMAP_MAX_TOKENS, CELL_NUMBERS_MAX_TOKENS, keyTokensOf, isCross, kvHeadOf, exportName, presentSlides } = globalThis.AttentionTrace.trace;
  const { heatmapSvg, gridsSvg } = globalThis.AttentionTrace.svg;
  const { isStack, numLayers } = globalThis.AttentionTrace.trace;
  const { kindLabel } = globalThis.AttentionTrace.heads;

  /** " · previous-token" after a constructed head's number (config.head_weights), '' for a seeded head. */
  function kindNote(cfg, head) {
    const kind = Array.isArray(cfg.head_weights) ? cfg.head_weights[head] : undefined;
    return kind && kind !== 'seeded' ? ` · ${kindLabel(kind)}` : '';
  }
  const BLOCK = globalThis.AttentionTrace.block;
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const STAGE_MAX_COLS = 32; // a block stage's features drawn; the JSON has them all
  const STAGE_NUMBERS_MAX_COLS = 16;

  const THUMBS_MAX_CELLS = 30000;
  const TALL_MAP_ROWS = 24; // above this many rows a map scrolls in its box, its column labels kept in view
  const VECTOR_NUMBERS_MAX = 96;
  const KEY_VECTORS_MAX = 12; // context keys listed with their vectors in the walkthrough
  const MATRIX_MAX_DIMS = 64; // d_k columns of Q (rows of Kᵀ) drawn; the JSON has them all
  const WEAK_CONTRAST = 0.15; // scaled and unscaled max weights closer than this: offer a configuration that shows it

  // ------------------------------------------------------------------ stateless builders

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

  /** createElementNS for the SVG diagram: attributes as given, kids appended; never parses markup. */
  function svgEl(tag, attrs, ...kids) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'text') node.textContent = v;
      else if (k === 'data') for (const [name, val] of Object.entries(v)) node.setAttribute(`data-${name}`, String(val));
      else if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    }
    for (const kid of kids.flat(Infinity)) if (kid !== null && kid !== undefined && kid !== false) node.append(kid);
    return node;
  }

  /** Shown as `visual` (with <sub>), read as `text`: screen readers would run "d<sub>model</sub>" into "dmodel". */
  const spoken = (visual, text) => [h('span', { 'aria-hidden': 'true' }, visual), h('span', { class: 'visually-hidden', text })];
  /** base with a subscript, read as "base_sub". */
  const sub = (text, base = 'd') => h('span', {}, spoken([base, h('sub', { text })], `${base}_${text}`));

  /** A cell coloured on the sequential scale: --t in [0, 1], dark ink flips to light. */
  function shade(node, t) {
    node.style.setProperty('--t', t.toFixed(4));
    node.classList.toggle('on-dark', t > ON_DARK_AT); // where white and black ink have equal contrast (4.6:1)
    return node;
  }

  /** A vector's first `limit` numbers in brackets; a longer one unfolds to all of them (its expander named after
   * `name`, so that several on one page are told apart). */
  function vec(values, digits = 3, limit = 8, name = '') {
    const shown = values.slice(0, limit).map((v, i) => h('span', { class: 'num', data: { i } }, fmt(v, digits)));
    const wrap = h('span', { class: 'vec', 'aria-label': `${values.length} values` },
      h('span', { class: 'bracket', text: '[' }), shown.slice(0, -1),
      h('span', { class: 'vec-end' }, shown.slice(-1), values.length > limit ? h('span', { class: 'ellipsis', text: ' …' }) : null,
        h('span', { class: 'bracket', text: ' ]' })));
    if (values.length <= limit) return wrap;
    return h('span', { class: 'vec-wrap' }, wrap, h('details', { class: 'vec-more' },
      h('summary', { text: `all ${values.length} values`, 'aria-label': name ? `all ${values.length} values of ${name}` : null }),
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
    return h('div', { class: className, data: { part } }, h('span', { class: 'vec-name', text: name }),
      vec(values, 3, 8, name.replace(/\s*=\s*$/, '')));
  }

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

  // ------------------------------------------------------------------ the sections

  function create(view) {
    const { state, ui, actions } = view;

    /** The line above the results: what was traced, and how long it took (or that it is a saved trace). */
    function renderStatus() {
      const doc = state.main.doc;
      const tokens = doc.tokens;
      const cfg = doc.config;
      const extras = [];
      if (cfg.positional_encoding === 'rope') extras.push(`RoPE ${cfg.rope_pairing === 'interleaved' ? 'interleaved' : 'rotate-half'}`);
      if (cfg.num_kv_heads !== undefined) extras.push(`${cfg.num_kv_heads} K/V head${cfg.num_kv_heads === 1 ? '' : 's'}`);
      if (cfg.window !== undefined) extras.push(`window ${cfg.window}`);
      if (isCross(doc)) extras.push(`cross-attention to ${cfg.n_context_tokens} context token${cfg.n_context_tokens === 1 ? '' : 's'}`);
      if (cfg.decode) extras.push('KV-cache decoding');
      const full = doc.full || doc;
      if (isStack(full)) {
        const b = BLOCK.blockOf(full, state.main.body);
        const L = numLayers(full);
        extras.push(`${b.preset ? `${b.preset} ` : ''}stack of ${L} layer${L === 1 ? '' : 's'}, showing layer ${doc.layer}`);
      }
      ui.traceStatus.textContent = `${tokens.length} token${tokens.length === 1 ? '' : 's'} · d_model ${cfg.d_model} · `
        + `${cfg.num_heads} head${cfg.num_heads === 1 ? '' : 's'} of d_k ${cfg.d_k}${extras.map((e) => ` · ${e}`).join('')}`
        + (state.main.ms === null ? ' · a saved trace' : ` · traced in ${Math.round(state.main.ms)} ms`);
    }

    /** The footer: the service's version, and the trace's engine, schema and weights. */
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
      renderMatrices();
      renderKv();
      renderDecode();
      renderSaturation();
      renderMultihead();
      renderBlock();
      renderResidual();
      renderNextToken();
      renderPresent();
    }

    function renderPickers() {
      const doc = state.main.doc;
      ui.tokenOptions.replaceChildren(...doc.tokens.map((t) => {
        const input = h('input', {
          type: 'radio', name: 'query', value: t.index, id: `query-${t.index}`, class: 'chip-input',
          'aria-label': `${t.text} (token ${t.index})`,
          onchange: () => actions.select(t.index, null),
        });
        return h('label', { class: 'chip', for: `query-${t.index}`, data: { index: t.index } },
          input, h('span', { class: 'chip-text', text: t.text }), h('span', { class: 'chip-index', text: t.index }));
      }));
      const heads = doc.config.num_heads;
      ui.headOptions.replaceChildren(...Array.from({ length: heads }, (_, i) => {
        const kind = kindNote(doc.config, i); // a constructed head says its job: "0 · previous-token"
        const input = h('input', {
          type: 'radio', name: 'head', value: i, id: `head-${i}`, class: 'chip-input',
          'aria-label': `head ${i} of ${heads}${kind}`,
          onchange: () => actions.select(null, i),
        });
        return h('label', { class: 'chip chip-head', for: `head-${i}` }, input, h('span', { class: 'chip-text', text: `${i}${kind}` }));
      }));
      // A stack: one chip a layer (changing it redraws from the answer on screen, no request).
      const full = doc.full || doc;
      const layers = isStack(full) ? numLayers(full) : 0;
      ui.layerPicker.hidden = layers === 0;
      ui.layerOptions.replaceChildren(...Array.from({ length: layers }, (_, i) => {
        const input = h('input', {
          type: 'radio', name: 'layer', value: i, id: `layer-${i}`, class: 'chip-input',
          'aria-label': `layer ${i} of ${layers}`,
          onchange: () => actions.selectLayer(i),
        });
        return h('label', { class: 'chip chip-head', for: `layer-${i}` }, input, h('span', { class: 'chip-text', text: `${i}` }));
      }));
      syncPickers();
    }

    function syncPickers() {
      for (const input of ui.tokenOptions.querySelectorAll('input')) input.checked = Number(input.value) === state.query;
      // The chosen token in view in its bar, which scrolls sideways on a long sentence (not the page: only the bar).
      const chip = ui.tokenOptions.querySelector('input:checked')?.closest('.chip');
      if (chip && ui.tokenOptions.scrollWidth > ui.tokenOptions.clientWidth) {
        const bar = ui.tokenOptions.getBoundingClientRect();
        const box = chip.getBoundingClientRect();
        if (box.left < bar.left || box.right > bar.right) {
          ui.tokenOptions.scrollLeft += box.left - bar.left - (bar.width - box.width) / 2;
        }
      }
      for (const input of ui.headOptions.querySelectorAll('input')) input.checked = Number(input.value) === state.head;
      const layer = state.main?.doc.layer;
      for (const input of ui.layerOptions.querySelectorAll('input')) input.checked = Number(input.value) === layer;
    }

    // -- walkthrough

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
      const headName = `${cfg.num_heads > 1 ? ` · head ${hd} of ${cfg.num_heads}` : ''}${kindNote(cfg, hd)}`;
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
          h('span', {}, h('code', { text: concatOf(cfg.num_heads) }), ` ${cfg.num_heads} × ${cfg.d_k} = ${cfg.num_heads * cfg.d_k} values`),
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
        explainWeights(tokens, keyTokens, q, weights, masked, cross, kindNote(cfg, hd).slice(3)));
      // A vector shown in two stages (Q before and after RoPE's rotation): its expanders say which stage is theirs.
      const named = new Map();
      for (const summary of ui.walkthrough.querySelectorAll('tr[data-stage] .vec-more > summary')) {
        const stage = summary.closest('tr[data-stage]').querySelector('th')?.textContent.trim();
        const base = `${summary.getAttribute('aria-label') || summary.textContent} (${stage})`;
        named.set(base, (named.get(base) ?? 0) + 1);
        summary.setAttribute('aria-label', named.get(base) > 1 ? `${base}, ${named.get(base)}` : base);
      }
    }

    /** The concat's formula: [head₀], [head₀ | head₁], [head₀ | … | head₁₁]. */
    function concatOf(heads) {
      if (heads <= 3) return `[${Array.from({ length: heads }, (_, i) => `head${subscript(i)}`).join(' | ')}]`;
      return `[head₀ | … | head${subscript(heads - 1)}]`;
    }

    function explainWeights(tokens, keyTokens, q, weights, masked, cross, kind = '') {
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
      // A constructed head's pattern is its job, written into its weights by hand; a seeded head's is chance.
      parts.push(kind ? `. This is a ${kind} head, its weights built by hand for that job: the pattern is the construction's.`
        : '. With random, untrained weights this pattern is an artefact of the initialisation, not understanding.');
      return h('p', { class: 'explain' }, parts.join(''));
    }

    // -- heatmaps

    /** The text of a map's exact value: a weight as a fraction and a percentage, a score as it is. */
    const valueText = (v, kind) => (kind === 'weight' ? `${fmt(v, 4)} (${pct(v, 2)})` : fmt(v, 4));

    /** The request's sentence as typed (the SVG's caption), or null for pre-split tokens. */
    const typedSentence = () => (typeof state.main.body?.sentence === 'string' ? state.main.body.sentence : null);

    /**
     * A figure's two download buttons (SVG, and PNG at 2×), as the maps have them: `what` names it in the buttons'
     * accessible names and `id` in their data-svg/data-png and the file's name; `figure()` builds its SVG (svg.js's
     * gridsSvg) from the numbers drawn on screen, when the button is pressed.
     */
    function figureButtons(id, what, figure) {
      const name = () => `${exportName(state.main.doc, state.main.body)}_${id}`;
      return h('div', { class: 'button-row svg-row' },
        h('button', { type: 'button', class: 'button button-small', data: { svg: id }, 'aria-label': `Download ${what} as SVG`,
          onclick: () => actions.downloadSvg(figure(), `${name()}.svg`) }, 'Download SVG'),
        h('button', { type: 'button', class: 'button button-small', data: { png: id }, 'aria-label': `Download ${what} as PNG (2×)`,
          onclick: () => actions.downloadPng(figure(), `${name()}.png`) }, 'PNG (2×)'));
    }

    function heatmap(spec) {
      const { stage, title, formula, matrix, tokens, kind, maskRow } = spec;
      const keyTokens = spec.keyTokens || tokens;
      const n = Math.min(matrix.length, HEATMAP_MAX_TOKENS);
      const m = Math.min(matrix[0]?.length ?? 0, HEATMAP_MAX_TOKENS);
      const compact = Math.max(n, m) > CELL_NUMBERS_MAX_TOKENS;
      const labels = tokens.slice(0, n).map((t) => t.text);
      const keyLabels = keyTokens.slice(0, m).map((t) => t.text);
      const keyWord = spec.keyTokens ? 'context key' : 'key';
      const scale = mapScale(matrix.slice(0, n).map((r) => r.slice(0, m)), { kind, mode: spec.mode, isMasked: maskRow });
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
            : `${title}: query ${quoted(labels[i])} → ${keyWord} ${quoted(keyLabels[j])}: ${valueText(v, kind)}`)
            + (explained ? ' (explained below)' : '');
          const td = h('td', {
            class: `hm-cell${isMasked ? ' is-masked' : ''}${explained ? ' is-explained' : ''}`, tabindex: -1, title: label,
            'aria-label': label,
            data: { row: i, col: j, value: v === null ? 'null' : String(v) },
          }, compact ? '' : (isMasked ? '—' : fmt(v, 2)));
          if (!isMasked) shade(td, scale.t(i, v));
          cells.push(td);
        }
        body.push(h('tr', { class: i === state.query ? 'is-query' : null, data: { row: i } },
          h('th', { scope: 'row', class: 'hm-row', title: `query ${i}: ${labels[i]}` },
            h('span', { class: 'hm-label', text: labels[i] })), cells));
      }
      const table = h('table', {
        class: `hm-grid${compact ? ' is-compact' : ''}`, role: 'grid',
        'aria-label': `${title}, head ${state.head}: rows are queries, columns are ${spec.keyTokens ? 'the context\'s keys' : 'keys'}`,
        data: { stage }, vars: { '--m': String(m) },
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
        if (cell.matches('td')) activateCell(stage, row, Number(cell.dataset.col), cell);
        else if (row !== state.query) actions.select(row, null, { focus: () => focusCell(stage, row, 0) });
      });
      const svgSpec = { ...spec, mode: scale.mode };
      // A map taller than a screen (above 24 rows) scrolls in its own box, its key labels stuck to the box's top.
      return h('figure', { class: `heatmap${n > TALL_MAP_ROWS ? ' is-tall' : ''}`, data: { stage } },
        h('figcaption', {}, h('span', { class: 'hm-title', text: title }), ' ', h('code', { class: 'hm-formula', text: formula })),
        h('div', { class: 'hm-scroll' }, table),
        h('p', { class: 'hint hm-more', 'aria-hidden': 'true', text: 'Scroll sideways for the other keys →' }),
        h('div', { class: 'legend-row' }, legend(scale, kind, spec.showMasked),
          h('button', {
            type: 'button', class: 'button button-small', data: { svg: stage },
            'aria-label': `Download the ${title.toLowerCase()} map of head ${state.head} as SVG`,
            onclick: () => actions.downloadSvg(heatmapSvg(svgSpec, { doc: state.main.doc, head: state.head, sentence: typedSentence() }),
              `${exportName(state.main.doc, state.main.body)}_${stage}_head${state.head}.svg`),
          }, 'Download SVG'),
          h('button', {
            type: 'button', class: 'button button-small', data: { png: stage },
            'aria-label': `Download the ${title.toLowerCase()} map of head ${state.head} as PNG (2×)`,
            onclick: () => actions.downloadPng(heatmapSvg(svgSpec, { doc: state.main.doc, head: state.head, sentence: typedSentence() }),
              `${exportName(state.main.doc, state.main.body)}_${stage}_head${state.head}.png`),
          }, 'PNG (2×)')));
    }

    /**
     * A cell clicked, or Enter on it: its row's token becomes the query, and the cell is explained. Everything is
     * drawn again for the new query; a click's cell is kept where it was on the screen (under the pointer), and the
     * readout names it.
     */
    function activateCell(stage, row, col, clicked = null) {
      const at = clicked ? clicked.getBoundingClientRect() : null;
      actions.explainCell(state.head, row, col);
      actions.select(row, null, { focus: () => focusCell(stage, row, col, at) });
    }

    function legend(scale, kind, showMasked) {
      const unitName = kind === 'weight' ? 'weight' : 'score';
      const note = (scale.mode === 'row' ? ', each row on its own' : '') + (scale.auto ? ' (chosen automatically)' : '');
      return h('div', { class: 'legend', data: { mode: scale.mode, auto: String(!!scale.auto) } },
        h('span', { class: 'legend-end', text: scale.lo }),
        h('span', { class: 'legend-bar', role: 'img',
          'aria-label': `colour scale of the ${unitName}s from ${scale.lo} (light) to ${scale.hi} (dark)${note}` }),
        h('span', { class: 'legend-end', text: scale.hi }),
        showMasked ? h('span', { class: 'legend-masked' }, h('span', { class: 'swatch is-masked', 'aria-hidden': 'true' }), 'masked') : null,
        scale.auto && scale.mode === 'row'
          ? h('span', { class: 'legend-auto', text: `each row on its own, chosen for ${scale.ranges.length} tokens` }) : null);
    }

    function readCell(target) {
      const cell = target.closest && target.closest('td.hm-cell');
      if (!cell) return;
      ui.readout.textContent = cell.getAttribute('aria-label');
    }

    /**
     * Focus a map's cell after a redraw. `keepAt`: where the cell was on the screen before (a click's): the page
     * scrolls so that it is there again, whatever changed above it, and the focus does not scroll.
     */
    function focusCell(stage, row, col, keepAt = null) {
      const cell = ui.maps.querySelector(`table[data-stage="${stage}"] td[data-row="${row}"][data-col="${col}"]`);
      if (!cell) return;
      for (const c of cell.closest('table').querySelectorAll('td[tabindex="0"]')) c.tabIndex = -1;
      cell.tabIndex = 0;
      if (keepAt) {
        const now = cell.getBoundingClientRect();
        const box = cell.closest('.hm-scroll');
        if (box && Math.abs(now.left - keepAt.left) >= 0.5) box.scrollLeft += now.left - keepAt.left;
        const moved = cell.getBoundingClientRect();
        if (Math.abs(moved.top - keepAt.top) >= 0.5 || Math.abs(moved.left - keepAt.left) >= 0.5) {
          window.scrollBy(moved.left - keepAt.left, moved.top - keepAt.top);
        }
        cell.focus({ preventScroll: true });
      } else {
        cell.focus();
      }
      readCell(cell);
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

    /** Mark each map whose columns do not all fit its box, so that its "scroll sideways" hint shows. */
    function markOverflow() {
      for (const box of ui.maps.querySelectorAll('.hm-scroll')) {
        box.closest('figure').classList.toggle('is-overflowing', box.scrollWidth > box.clientWidth + 1);
      }
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
      const mode = state.colour;
      const layerNote = Number.isInteger(doc.layer) ? ` · layer ${doc.layer} of ${numLayers(doc.full)}` : '';
      const headNote = `${cfg.num_heads > 1 ? ` · head ${hd} of ${cfg.num_heads}` : ''}${kindNote(cfg, hd)}`;
      ui.mapsTitle.replaceChildren(`Attention maps${layerNote}${headNote}${crossNote}`);
      const maps = [
        heatmap({ stage: 'scores', title: 'Scores', formula: qk, matrix: S.scores.values[hd], tokens, keyTokens, kind: 'score', mode }),
        heatmap({ stage: 'scaled_scores', title: 'Scaled scores', formula: cfg.scale ? `${qk}/√${cfg.d_k}` : `${qk}/1 (scaling off)`,
          matrix: S.scaled_scores.values[hd], tokens, keyTokens, kind: 'score', mode }),
      ];
      if (masked) {
        const formula = cfg.window !== undefined ? `future keys and keys ≥ ${cfg.window} back → −∞` : 'future keys → −∞';
        maps.push(heatmap({ stage: 'masked_scores', title: cfg.window !== undefined ? 'Masked scores (sliding window)' : 'Masked scores',
          formula, matrix: masked.values[hd], tokens, keyTokens, kind: 'score', mode, showMasked: true }));
      }
      maps.push(heatmap({ stage: 'weights', title: 'Weights', formula: 'softmax: rows sum to 1', matrix: S.weights.values[hd],
        tokens, keyTokens, kind: 'weight', mode, maskRow: isMasked, showMasked: !!masked }));
      const longest = Math.max(tokens.length, (keyTokens || tokens).length);
      const note = longest > HEATMAP_MAX_TOKENS
        ? h('p', { class: 'hint hm-cap', text: `Showing the first ${HEATMAP_MAX_TOKENS} of ${longest} tokens: the page draws at most `
          + `${HEATMAP_MAX_TOKENS} a map, so that each cell stays at least 10 px wide and the map one screen wide; `
          + 'download the JSON for all of them.' })
        : null;
      // Columns as wide as one map needs: about 2.8em a cell with its number, plus the row labels; above 12 keys
      // the cells shrink to fit their box (style.css, from 10 px), so a map asks for about 15 px a key.
      const m = Math.min((keyTokens || tokens).length, HEATMAP_MAX_TOKENS);
      const compact = Math.max(Math.min(tokens.length, HEATMAP_MAX_TOKENS), m) > CELL_NUMBERS_MAX_TOKENS;
      const minWidth = compact ? `${(7 * 16 + m * 15).toFixed(0)}px` : `${Math.max(14, m * 2.8 + 5).toFixed(2)}em`;
      const grid = h('div', { class: `heatmaps${compact ? ' is-compact' : ''}`, vars: { '--hm-min': minWidth } }, maps);
      ui.maps.replaceChildren(...[grid, note].filter(Boolean));
      markOverflow();
      renderThumbs();
    }

    /**
     * Every head's weights side by side, each a labelled map at a readable size (and a button that picks its head),
     * on the maps' colour scale.
     */
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
      const size = Math.max(n, nk) <= 6 ? 'is-large' : Math.max(n, nk) <= 12 ? 'is-medium' : 'is-small';
      const numbers = size === 'is-large';
      const rowLabels = doc.tokens.slice(0, n).map((t) => t.text);
      const colLabels = keyTokens.slice(0, nk).map((t) => t.text);
      const figure = []; // each head's grid for the SVG, with the numbers drawn here
      const thumbs = W.map((mat, hi) => {
        const isMasked = masked ? (i, j) => masked.values[hi][i][j] === null : null;
        const scale = mapScale(mat.slice(0, n).map((r) => r.slice(0, nk)), { kind: 'weight', mode: state.colour, isMasked });
        const cellsOf = [];
        const grid = h('span', { class: `thumb-grid ${size}`, vars: { '--n': String(nk) }, 'aria-hidden': 'true' },
          h('span', { class: 'thumb-corner' }),
          colLabels.map((l) => h('span', { class: 'thumb-col', title: l }, h('span', { class: 'thumb-label', text: l }))));
        for (let i = 0; i < n; i += 1) {
          grid.append(h('span', { class: `thumb-row${i === state.query ? ' is-query' : ''}`, title: rowLabels[i] },
            h('span', { class: 'thumb-label', text: rowLabels[i] })));
          cellsOf.push([]);
          for (let j = 0; j < nk; j += 1) {
            const off = isMasked && isMasked(i, j);
            const text = numbers && !off ? fmt(mat[i][j], 2) : '';
            const c = h('span', { class: `thumb-cell${off ? ' is-masked' : ''}${i === state.query ? ' is-query' : ''}` }, text);
            if (!off) shade(c, scale.t(i, mat[i][j]));
            grid.append(c);
            cellsOf[i].push({ t: off ? null : scale.t(i, mat[i][j]), text,
              title: `head ${hi}: query ${quoted(rowLabels[i])} → key ${quoted(colLabels[j])}: `
                + `${off ? 'masked (weight 0)' : `${fmt(mat[i][j], 4)} (${pct(mat[i][j], 2)})`}` });
          }
        }
        const row = mat[state.query];
        const top = row.indexOf(Math.max(...row));
        const kv = cfg.query_heads_of_kv_head ? ` · K/V ${kvHeadOf(cfg, hi)}` : '';
        figure.push({ caption: `head ${hi}${kindNote(cfg, hi)}${kv}: ${quoted(doc.tokens[state.query].text)} → ${keyTokens[top].text} `
          + `${pct(row[top], 0)}`, rows: rowLabels, cols: colLabels, cells: cellsOf, queryRow: state.query, scale });
        return h('button', {
          type: 'button', class: 'thumb', 'aria-pressed': hi === state.head ? 'true' : 'false', data: { head: hi },
          'aria-label': `Head ${hi}${kindNote(cfg, hi)}${kv ? ` (reads K/V head ${kvHeadOf(cfg, hi)})` : ''}: ${quoted(doc.tokens[state.query].text)} `
            + `attends most to ${quoted(keyTokens[top].text)} (${pct(row[top])})`,
          onclick: () => actions.select(null, hi),
        }, h('span', { class: 'thumb-caption' }, `head ${hi}${kindNote(cfg, hi)}${kv}`,
          h('span', { class: 'thumb-top', text: `${quoted(doc.tokens[state.query].text)} → ${keyTokens[top].text} ${pct(row[top], 0)}` })), grid);
      });
      const title = 'Every head\'s weights, side by side';
      const his = new Set(figure.map((f) => f.scale.hi));
      const layerNote = Number.isInteger(doc.layer) ? ` · layer ${doc.layer} of ${numLayers(doc.full)}` : '';
      const headsSvg = () => gridsSvg({ heading: `${title}${layerNote}`, label: `${title}: attention-trace`, doc,
        sentence: typedSentence(), grids: figure, perRow: Math.min(4, figure.length),
        legend: { lo: figure[0].scale.lo, hi: his.size === 1 ? figure[0].scale.hi : 'each head\'s largest weight' },
        desc: 'One grid a head: rows are queries, columns are keys, each cell the weight.' });
      ui.thumbs.replaceChildren(
        h('h3', { class: 'subhead', text: title }),
        h('p', { class: 'hint', text: 'Same sentence, different projections, different soft distributions; the same colour '
          + 'scale as the maps. Pick a head to inspect it.' }),
        h('div', { class: `thumbs ${size}` }, thumbs),
        figureButtons('heads', 'every head\'s weights', headsSvg));
    }

    // -- Q, Kᵀ and QKᵀ

    /** One matrix as a labelled table: `rows` and `cols` its labels, numbers when `numbers`, coloured on its range. */
    function matrixTable(name, caption, values, rows, cols, { numbers, queryRow = null, rowHead, colHead }) {
      const range = extent(values);
      figureGrids.push({ caption, rows, cols, queryRow, cells: values.map((r, i) => r.map((v, j) => ({
        t: unit(v, range), text: numbers ? fmt(v, 2) : '', title: `${name}[${rows[i]}, ${cols[j]}] = ${fmt(v, 4)}` }))) });
      return h('table', { class: `mx-grid${numbers ? '' : ' is-compact'}`, data: { matrix: name }, vars: { '--m': String(cols.length) } },
        h('caption', { class: 'mx-caption' }, caption),
        h('thead', {}, h('tr', {}, h('th', { class: 'mx-corner', scope: 'col' }, h('span', { class: 'visually-hidden', text: `${rowHead} \\ ${colHead}` })),
          cols.map((c, j) => h('th', { scope: 'col', class: 'mx-col', data: { col: j }, title: `${colHead} ${c}` }, h('span', { class: 'mx-label', text: c }))))),
        h('tbody', {}, values.map((r, i) => h('tr', { data: { row: i }, class: i === queryRow ? 'is-query' : null },
          h('th', { scope: 'row', class: 'mx-row', title: `${rowHead} ${rows[i]}` }, h('span', { class: 'mx-label', text: rows[i] })),
          r.map((v, j) => shade(h('td', { class: 'mx-cell', data: { row: i, col: j }, title: `${name}[${rows[i]}, ${cols[j]}] = ${fmt(v, 4)}` },
            numbers ? fmt(v, 2) : ''), unit(v, range)))))));
    }

    let figureGrids = []; // the matrices as drawn, for the SVG (matrixTable adds each)

    function renderMatrices() {
      figureGrids = [];
      const { doc } = state.main;
      const S = doc.stages;
      const cfg = doc.config;
      const hd = state.head;
      const kvh = kvHeadOf(cfg, hd);
      const rope = cfg.positional_encoding === 'rope';
      const keyTokens = keyTokensOf(doc);
      const n = Math.min(doc.tokens.length, HEATMAP_MAX_TOKENS);
      const m = Math.min(keyTokens.length, HEATMAP_MAX_TOKENS);
      const d = Math.min(cfg.d_k, MATRIX_MAX_DIMS);
      const Q = (rope ? S.q_rotated : S.q).values[hd].slice(0, n).map((r) => r.slice(0, d));
      const K = (rope ? S.k_rotated : S.k).values[kvh].slice(0, m).map((r) => r.slice(0, d));
      const KT = Array.from({ length: d }, (_, c) => K.map((r) => r[c]));
      const scores = S.scores.values[hd].slice(0, n).map((r) => r.slice(0, m));
      const rows = doc.tokens.slice(0, n).map((t) => t.text);
      const keys = keyTokens.slice(0, m).map((t) => t.text);
      const dims = Array.from({ length: d }, (_, c) => String(c));
      const numbers = cfg.d_k <= 8 && Math.max(n, m) <= CELL_NUMBERS_MAX_TOKENS;
      const qName = rope ? 'RoPE(Q)' : 'Q';
      const kName = rope ? 'RoPE(K)ᵀ' : 'Kᵀ';
      const head = cfg.num_heads > 1 ? `, head ${hd}` : '';
      const kvText = cfg.num_kv_heads !== undefined && cfg.num_kv_heads !== cfg.num_heads ? ` (K/V head ${kvh})` : '';
      ui.matricesTitle.replaceChildren(`${qName} · ${kName} = scores${head}`);
      const q = state.query < n ? state.query : null;
      const tables = [
        matrixTable('Q', `${qName}: ${n} × ${cfg.d_k}`, Q, rows, dims, { numbers, queryRow: q, rowHead: 'query', colHead: 'dimension' }),
        h('span', { class: 'mx-op', 'aria-hidden': 'true', text: '·' }),
        matrixTable('KT', `${kName}${kvText}: ${cfg.d_k} × ${m}`, KT, dims, keys, { numbers, rowHead: 'dimension', colHead: isCross(doc) ? 'context key' : 'key' }),
        h('span', { class: 'mx-op', 'aria-hidden': 'true', text: '=' }),
        matrixTable('scores', `scores: ${n} × ${m}`, scores, rows, keys, { numbers: Math.max(n, m) <= CELL_NUMBERS_MAX_TOKENS, queryRow: q,
          rowHead: 'query', colHead: 'key' }),
      ];
      const cut = cfg.d_k > d || doc.tokens.length > n || keyTokens.length > m
        ? h('p', { class: 'hint', text: `Showing ${n} × ${d} of Q and ${d} × ${m} of Kᵀ; download the JSON for all of them.` }) : null;
      const eq = h('div', { class: 'mx-equation' }, tables);
      eq.addEventListener('mouseover', (e) => pointMatrices(e.target));
      eq.addEventListener('mouseleave', () => pointMatrices(null));
      const grids = figureGrids;
      const heading = ui.matricesTitle.textContent;
      const matricesSvg = () => gridsSvg({ heading, label: `${heading}: attention-trace`, doc, sentence: typedSentence(), grids,
        ops: ['·', '='], notes: [`Each matrix is coloured on its own range (its min … max); scores = ${qName} · ${kName}.`,
          ...(cut ? [cut.textContent] : [])],
        desc: 'Q, the transposed keys and the scores, as on the page.' });
      ui.matrices.replaceChildren(...[h('div', { class: 'mx-scroll' }, eq), cut,
        figureButtons(`matrices_head${hd}`, `${qName} · ${kName} = scores of head ${hd}`, matricesSvg)].filter(Boolean));
    }

    /** A score pointed at: its row of Q and its column of Kᵀ light up, and the readout says so. */
    function pointMatrices(target) {
      for (const el of ui.matrices.querySelectorAll('.is-pointed')) el.classList.remove('is-pointed');
      const cell = target && target.closest && target.closest('table[data-matrix="scores"] td.mx-cell');
      if (!cell) return;
      const { row, col } = cell.dataset;
      cell.classList.add('is-pointed');
      for (const el of ui.matrices.querySelectorAll(`table[data-matrix="Q"] tr[data-row="${row}"] td, `
        + `table[data-matrix="KT"] td[data-col="${col}"]`)) el.classList.add('is-pointed');
      const doc = state.main.doc;
      const keyTokens = keyTokensOf(doc);
      const v = doc.stages.scores.values[state.head][Number(row)][Number(col)];
      ui.matricesReadout.textContent = `scores[${quoted(doc.tokens[row].text)}, ${quoted(keyTokens[col].text)}] = `
        + `row ${row} of Q · column ${col} of Kᵀ = Σ over the ${doc.config.d_k} dimensions of q·k = ${fmt(v, 4)}`;
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
      const t = state.step === null ? 0 : Math.min(Math.max(state.step, 0), last); // from the first step, as generated
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
      ui.decodeBody.replaceChildren(...[
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
          + 'the cache changes the cost, not the numbers.'),
      ].filter(Boolean));
    }

    // -- saturation

    function renderSaturation() {
      const cfg = state.main.doc.config;
      // While the comparison for this trace is on its way, the section keeps its content, marked busy (and dimmed
      // only if that lasts: no flash), and it cannot be downloaded.
      ui.saturationSection.classList.toggle('is-updating', state.altPending);
      ui.saturationSection.setAttribute('aria-busy', String(state.altPending));
      ui.saturationSvg.disabled = state.altPending || !state.alt;
      if (ui.saturationPng) ui.saturationPng.disabled = ui.saturationSvg.disabled;
      if (state.altPending) return;
      if (!state.alt) {
        const msg = state.altError ? `The comparison trace failed: ${state.altError.message}`
          : view.saved ? 'This saved trace holds no comparison trace.' : 'No comparison trace.';
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
      // A small d_k hardly saturates: the lesson needs a wider head. One click sets up one that shows it (the
      // sentence kept): d_model 64 with one head, d_k 64 (e.g. "the cat sat": 44.1% → 94.6% for "cat").
      const weak = visible > 1 && Math.abs(mu - ms) < WEAK_CONTRAST && !view.saved && actions.demo;
      const demo = weak ? h('p', { class: 'explain demo-note' },
        `Here the largest weight moves by ${fmt(Math.abs(mu - ms) * 100, 1)} points only: with d_k = ${scaled.config.d_k} the raw `
        + 'scores are still small. ',
        h('button', { type: 'button', class: 'button button-small', id: 'saturation-demo', onclick: () => actions.demo() },
          'Show it with d_k = 64 (d_model 64, one head)')) : null;
      ui.saturation.replaceChildren(h('div', { class: 'saturation-layout' },
        h('div', { class: 'table-scroll' }, table), h('div', {}, h('p', { class: 'explain', text }), demo)));
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
        h('span', { class: 'mh-label' }, `head ${i}${kindNote(cfg, i)}`, h('span', { class: 'row-note', text: `length ${fmt(norm(hv), 2)}` })),
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

    // -- a stack: the block's diagram, the stage shown, the residual stream

    /** The box whose stages are shown: state.bstage when the block has it, else the first box (the layer's first step). */
    function shownBox(diagram) {
      return diagram.order.includes(state.bstage) ? state.bstage : diagram.order[0];
    }

    /** One stage of the chosen layer as a token × feature table, coloured on its range (numbers when it is small). */
    function stageMatrix(sid, st, tokens) {
      const cols = Math.min(st.shape.at(-1), STAGE_MAX_COLS);
      const rows = Math.min(tokens.length, HEATMAP_MAX_TOKENS);
      const values = st.values.slice(0, rows).map((r) => r.slice(0, cols));
      const range = extent(values);
      const numbers = cols <= STAGE_NUMBERS_MAX_COLS && rows <= CELL_NUMBERS_MAX_TOKENS;
      const axis = st.axes.at(-1);
      const head = h('tr', {}, h('th', { class: 'mx-corner', scope: 'col' }, h('span', { class: 'visually-hidden', text: `token \\ ${axis}` })),
        Array.from({ length: cols }, (_, j) => h('th', { scope: 'col', class: 'mx-col', title: `${axis} ${j}` },
          h('span', { class: 'mx-label', text: String(j) }))));
      const body = values.map((r, i) => h('tr', { data: { row: i }, class: i === state.query ? 'is-query' : null },
        h('th', { scope: 'row', class: 'mx-row', title: `token ${i}: ${tokens[i].text}` }, h('span', { class: 'mx-label', text: tokens[i].text })),
        r.map((v, j) => shade(h('td', { class: 'mx-cell', data: { row: i, col: j, value: String(v) },
          title: `${sid}[${tokens[i].text}, ${j}] = ${fmt(v, 4)}` }, numbers ? fmt(v, 2) : ''), unit(v, range)))));
      const table = h('table', { class: `mx-grid bs-grid${numbers ? '' : ' is-compact'}`, data: { stage: sid }, vars: { '--m': String(cols) } },
        h('caption', { class: 'mx-caption' }, h('span', { class: 'bs-title', text: st.title }), ' ',
          h('code', { class: 'hm-formula', text: `${sid} [${tokens.length} × ${st.shape.at(-1)}]` })),
        h('thead', {}, head), h('tbody', {}, body));
      const cut = st.shape.at(-1) > cols || tokens.length > rows
        ? h('p', { class: 'hint', text: `Showing ${rows} × ${cols} of ${tokens.length} × ${st.shape.at(-1)}; download the JSON for all of them.` })
        : null;
      return h('div', { class: 'bs-part' }, h('div', { class: 'mx-scroll' }, table), h('p', { class: 'hint bs-formula' }, h('code', { text: st.formula || '' })), cut);
    }

    /** A norm's statistics, one column a statistic, one row a token. */
    function stageStats(ids, S, tokens) {
      const names = { mean: 'mean μ', variance: 'variance σ²', mean_square: 'mean(x²)' };
      return h('div', { class: 'bs-part' }, h('div', { class: 'table-scroll' }, h('table', { class: 'side-table bs-stats' },
        h('caption', { class: 'mx-caption', text: 'Over each token\'s features' }),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col', text: 'token' }),
          ids.map((sid) => h('th', { scope: 'col', title: S[sid].formula || '' }, names[sid.replace(/^(norm1|norm2|final_norm)_/, '')] || sid)))),
        h('tbody', {}, tokens.map((t, i) => h('tr', { data: { row: i }, class: i === state.query ? 'is-query' : null },
          h('th', { scope: 'row', text: t.text }),
          ids.map((sid) => h('td', { class: 'num', data: { stage: sid, value: String(S[sid].values[i]) }, text: fmt(S[sid].values[i], 4) }))))))));
    }

    /** The diagram of the block, as SVG: one focusable button a box, the shown box highlighted. */
    function blockSvg(diagram, shown, title) {
      const box = (b) => {
        const isShown = b.id === shown;
        const shape = b.kind === 'add'
          ? svgEl('circle', { class: 'bd-shape', cx: b.x, cy: b.y, r: b.w / 2 })
          : svgEl('rect', { class: 'bd-shape', x: b.x, y: b.y, width: b.w, height: b.h, rx: 6 });
        const texts = b.kind === 'add'
          ? [svgEl('text', { class: 'bd-label bd-plus', x: b.x, y: b.y + 5, 'text-anchor': 'middle', text: '+' }),
            svgEl('text', { class: 'bd-detail', x: b.x - b.w / 2 - 8, y: b.y + 4, 'text-anchor': 'end', text: b.detail })]
          : [svgEl('text', { class: 'bd-label', x: b.x + b.w / 2, y: b.y + 16, 'text-anchor': 'middle', text: b.label }),
            svgEl('text', { class: 'bd-detail', x: b.x + b.w / 2, y: b.y + 31, 'text-anchor': 'middle', text: b.detail })];
        const name = b.kind === 'add' ? `Add (${b.id}): ${b.detail}` : `${b.label}: ${b.detail}`;
        return svgEl('g', {
          class: `bd-box is-${b.kind}${isShown ? ' is-shown' : ''}`, role: 'button', tabindex: 0, 'aria-pressed': String(isShown),
          'aria-label': name, data: { box: b.id },
          onclick: () => actions.selectBox(b.id),
          onkeydown: (e) => boxKeys(e, diagram, b.id),
        }, svgEl('title', { text: name }), shape, texts);
      };
      const arrow = (a) => svgEl('polyline', { class: `bd-arrow is-${a.kind}`, points: a.points.map((p) => p.join(',')).join(' '),
        'marker-end': 'url(#bd-head)' });
      return svgEl('svg', { class: 'bd-svg', viewBox: `0 0 ${diagram.width} ${diagram.height}`, width: diagram.width,
        height: diagram.height, role: 'group', 'aria-label': title },
      svgEl('defs', {}, svgEl('marker', { id: 'bd-head', viewBox: '0 0 8 8', refX: 7, refY: 4, markerWidth: 7, markerHeight: 7,
        orient: 'auto-start-reverse' }, svgEl('path', { class: 'bd-head', d: 'M0,0 L8,4 L0,8 z' }))),
      diagram.arrows.map(arrow),
      diagram.labels.map((l) => svgEl('text', { class: 'bd-note', x: l.x, y: l.y, 'text-anchor': 'middle', data: { label: l.id }, text: l.text })),
      diagram.boxes.map(box));
    }

    /** Keys on a box: Enter or Space shows it, the arrows move to the box before or after it. */
    function boxKeys(e, diagram, id) {
      const at = diagram.order.indexOf(id);
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        actions.selectBox(id, { focus: true });
      } else if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
        e.preventDefault();
        const next = diagram.order[Math.min(Math.max(at + (e.key === 'ArrowDown' ? 1 : -1), 0), diagram.order.length - 1)];
        ui.blockDiagram.querySelector(`[data-box="${next}"]`)?.focus();
      }
    }

    function renderBlock() {
      const doc = state.main.doc;
      const full = doc.full || doc;
      if (!isStack(full)) {
        ui.blockSection.hidden = true;
        ui.blockDiagram.replaceChildren();
        ui.blockStage.replaceChildren();
        return;
      }
      ui.blockSection.hidden = false;
      const cfg = doc.config;
      const L = numLayers(full);
      const b = BLOCK.blockOf(full, state.main.body);
      const diagram = BLOCK.blockDiagram(b, { causal: cfg.causal, numHeads: cfg.num_heads, layer: doc.layer, numLayers: L });
      const shown = shownBox(diagram);
      const focused = ui.blockDiagram.contains(document.activeElement) ? document.activeElement.dataset?.box : null;
      const kind = b.pre ? 'pre-norm' : 'post-norm';
      ui.blockTitle.replaceChildren(`The block · layer ${doc.layer} of ${L}${b.preset ? ` · ${b.preset}` : ''} (${kind})`);
      ui.blockDiagram.replaceChildren(blockSvg(diagram, shown,
        `Layer ${doc.layer}'s block, ${kind}: ${diagram.order.join(', ')}; the box shown is ${shown}`));
      if (focused) ui.blockDiagram.querySelector(`[data-box="${focused}"]`)?.focus({ preventScroll: true });
      const box = diagram.boxes.find((x) => x.id === shown);
      const S = doc.stages;
      const ids = BLOCK.boxStages(shown, S);
      const stats = ids.filter(BLOCK.isStatStage);
      const where = shown === 'final_norm' ? `the last layer's output, x${BLOCK.subscriptDigits(L)}` : `layer ${doc.layer}`;
      ui.blockStage.replaceChildren(...[
        h('h3', { class: 'subhead', data: { box: shown } }, `${box.kind === 'add' ? `Add: ${shown}` : box.label}`,
          h('span', { class: 'muted', text: ` · ${where} · ${box.detail}` })),
        shown === 'attention'
          ? h('p', { class: 'hint', text: `The maps above are this layer's (layer ${doc.layer}): its scores and weights for the chosen head. `
            + 'Below, the attention\'s output, the heads concatenated and mixed by W_O.' }) : null,
        stats.length ? stageStats(stats, S, doc.tokens) : null,
        ...ids.filter((sid) => !BLOCK.isStatStage(sid)).map((sid) => stageMatrix(sid, S[sid], doc.tokens)),
      ].filter(Boolean));
    }

    /**
     * The language-model head's next-token panel (an answer with `vocabulary`): the top 10 tokens as bars. At the
     * answer's temperature the bars are its own next_token_probs; at another (the slider, state.temperature) they are
     * softmax(logits[n − 1] / T) of the answer's logits, computed here (stable: the row's max subtracted first).
     * With the answer's `generation` (a saved page of a request with generate), or on the live page with the
     * generation the service answered (state.gen, app.js's generateStep), "Generate a token" appends its next token
     * (state.generated): the bars become the distribution that token was chosen from, the chosen bar marked, and
     * the new token's row of attention (the layer and head shown) is drawn over the tokens cached. The live page's
     * request on its way, or its refusal, is said under the button; a trace the service would refuse to generate
     * from (whyNoGeneration) disables the button, the reason said there before any press.
     */
    function renderNextToken() {
      const full = state.main.doc.full || state.main.doc;
      const vocab = full.vocabulary;
      const logits = full.stages.logits;
      if (!Array.isArray(vocab) || !logits || !full.stages.next_token_probs) {
        ui.nextTokenSection.hidden = true;
        ui.nextTokenBody.replaceChildren();
        return;
      }
      ui.nextTokenSection.hidden = false;
      const live = view.saved ? null : state.gen; // the live page's generation, asked for by "Generate a token"
      const source = view.saved ? full : live?.doc; // the answer whose generation the panel walks
      const gen = Array.isArray(source?.generation) ? source.generation : [];
      const k = Math.min(state.generated, gen.length);
      const step = k > 0 ? gen[k - 1] : null;
      const given = step ? source.config.temperature : full.config.temperature; // the shown distribution's own T
      const T = state.temperature ?? full.config.temperature;
      const limit = view.saved ? gen.length : live ? live.limit : Infinity;
      const why = view.saved ? null : whyNoGeneration(state.main.body, full.config); // refused before any press
      ui.lmGenerate.hidden = view.saved && gen.length === 0;
      ui.lmGenerate.disabled = !!why || k >= limit || !!live?.pending;
      ui.lmGenerateReset.hidden = k === 0;
      ui.lmDecoding.hidden = view.saved;
      const status = why ?? (live?.pending ? 'Asking the service for the next tokens…' : live?.error ? refusalText(live.error) : '');
      ui.lmGenerateStatus.hidden = status === '';
      ui.lmGenerateStatus.textContent = status;
      ui.lmGenerateStatus.classList.toggle('is-refused', !live?.pending && !!live?.error);
      const row = step ? step.logits : logits.values[logits.values.length - 1];
      let probs = step ? step.probs : full.stages.next_token_probs.values;
      if (T !== given) {
        const peak = Math.max(...row.map((z) => z / T));
        const e = row.map((z) => Math.exp(z / T - peak));
        const total = e.reduce((a, b) => a + b, 0);
        probs = e.map((x) => x / total);
      }
      ui.lmTemperature.value = String(T);
      ui.lmTemperatureValue.value = fmt(T, 2);
      ui.lmTemperatureValue.textContent = fmt(T, 2);
      const order = probs.map((p, j) => j).sort((a, b) => probs[b] - probs[a] || a - b).slice(0, 10);
      const texts = [...full.tokens.map((t) => t.text), ...gen.slice(0, k).map((s) => s.token)];
      const last = texts[texts.length - (step ? 2 : 1)];
      const chosen = step ? step.index : null;
      let generated = null;
      if (step) {
        const layer = Math.min(state.main.doc.layer ?? 0, step.weights.length - 1);
        const w = step.weights[layer][Math.min(state.head, step.weights[layer].length - 1)];
        generated = h('div', { class: 'nt-generated' },
          h('p', { class: 'explain', text: `Step ${k} of ${gen.length}: ${quoted(step.token)} chosen with p = `
            + `${fmt(100 * step.probability, 1)}% (${source.config.sample_seed == null ? 'greedy' : 'sampled'}) and appended at `
            + `position ${step.position}. Its row of attention, layer ${layer}, head ${state.head}:` }),
          h('ol', { class: 'nt-attention', 'aria-label': `The new token's attention over the cached tokens` },
            step.cache_positions.map((pos, c) => h('li', { data: { pos, weight: String(w[c]) } },
              h('span', { class: 'nt-token', text: texts[pos] }),
              h('span', { class: 'nt-track' }, h('span', { class: 'nt-bar', vars: { '--nt-width': `${(100 * w[c]).toFixed(2)}%` } })),
              h('span', { class: 'nt-prob num', text: `${fmt(100 * w[c], 1)}%` })))));
      }
      ui.nextTokenBody.replaceChildren(
        h('p', { class: 'nt-sequence', text: texts.join(' ') }),
        h('p', { class: 'explain', text: `After ${quoted(last)}, at T = ${fmt(T, 2)}${T === given ? ' (the answer\'s)' : ''}: `
          + `the ${order.length} most probable of the vocabulary's ${vocab.length} tokens.` }),
        h('ol', { class: 'next-token-bars', 'aria-label': 'The most probable next tokens' }, order.map((j) =>
          h('li', { class: j === chosen ? 'nt-row is-chosen' : 'nt-row', data: { token: vocab[j], column: j, prob: String(probs[j]) } },
            h('span', { class: 'nt-token', text: vocab[j] }),
            h('span', { class: 'nt-track' }, h('span', { class: 'nt-bar', vars: { '--nt-width': `${(100 * probs[j]).toFixed(2)}%` } })),
            h('span', { class: 'nt-prob num', text: `${fmt(100 * probs[j], 1)}%` })))), generated);
    }

    /**
     * Why the live page's generate step cannot ask for the trace on screen, in plain words, or null: the service's
     * own two rules a page can meet, read before any press. generate needs causal: true (engine/lm.py,
     * generate_conflicts: generate_needs_causal), the causal mask the answer's config says the service used (the
     * request's own, or its block preset's, as vaswani2017's none); and no interventions (engine/interventions.py,
     * intervention_conflicts: interventions_conflict), the ablations the request on screen carries. Anything else
     * the service refuses is said after the press (refusalText).
     */
    function whyNoGeneration(body, cfg) {
      const reasons = [];
      if (!cfg.causal) {
        reasons.push('Generation needs a causal mask: each new token is predicted from the tokens before it, and '
          + `this ${cfg.block ? `${cfg.block} stack` : 'trace'} lets every token attend to every other, later ones `
          + 'too. Turn on "Causal mask" to generate.');
      }
      const ivs = Array.isArray(body.interventions) ? body.interventions : [];
      if (ivs.length) {
        const heads = ivs.filter((iv) => iv.target === 'head_output');
        const mlps = ivs.filter((iv) => iv.target === 'mlp_output');
        const what = heads.length === ivs.length ? (heads.length > 1 ? 'heads are' : 'a head is')
          : mlps.length === ivs.length ? (mlps.length > 1 ? 'MLPs are' : 'an MLP is') : 'part of the model is';
        const named = [...heads.map((iv) => `layer ${iv.layer}, head ${iv.head}`),
          ...mlps.map((iv) => `layer ${iv.layer}'s MLP`)];
        reasons.push(`Generation is off while ${what} ablated${named.length ? ` (${named.join('; ')})` : ''}: `
          + 'the service generates with the whole model, so its tokens would not follow the ablated trace on '
          + 'screen, and it refuses the two together. Undo the ablation to generate.');
      }
      return reasons.length ? reasons.join(' ') : null;
    }

    /** A refused generate request in words: the problem document's title and each error's message. */
    function refusalText(err) {
      const p = err?.problem;
      if (!p || typeof p !== 'object') {
        return err?.status ? `The service refused to generate (HTTP ${err.status}).`
          : `Could not reach the service: ${err?.message || err}.`;
      }
      const items = Array.isArray(p.errors) && p.errors.length ? p.errors.map((e) => e.message || '') : [p.detail || ''];
      return `Not generated: ${p.title || 'refused'} (HTTP ${p.status || err.status}): ${items.filter(Boolean).join('; ')}`;
    }

    function renderResidual() {
      const doc = state.main.doc;
      const full = doc.full || doc;
      const stream = full.stages.residual_stream;
      if (!isStack(full) || !stream) {
        ui.residualSection.hidden = true;
        ui.residualBody.replaceChildren();
        return;
      }
      ui.residualSection.hidden = false;
      const norms = BLOCK.residualNorms(stream.values); // [depth, token]
      const L = norms.length - 1;
      const labels = BLOCK.depthLabels(L);
      const range = extent(norms);
      const tokens = doc.tokens;
      const table = h('table', { class: 'side-table residual-table' },
        h('caption', { class: 'visually-hidden', text: 'Each token\'s ‖x‖ at each depth of the residual stream' }),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col', text: 'token' }),
          labels.map((l, d) => h('th', { scope: 'col', data: { depth: d }, class: d === doc.layer + 1 ? 'is-layer' : null }, l)))),
        h('tbody', {}, tokens.map((t, i) => h('tr', { data: { row: i }, class: i === state.query ? 'is-query' : null },
          h('th', { scope: 'row', text: t.text }),
          norms.map((byToken, d) => shade(h('td', { class: 'num rs-cell', data: { depth: d, token: i, value: String(byToken[i]) },
            title: `‖x${BLOCK.subscriptDigits(d)}‖ of ${quoted(t.text)} = ${fmt(byToken[i], 6)}` }, fmt(byToken[i], 3)),
          unit(byToken[i], range)))))));
      const q = state.query;
      const grow = norms[L][q] / norms[0][q];
      const sentence = `${quoted(tokens[q].text)}: ‖x‖ goes from ${fmt(norms[0][q], 3)} at the input to `
        + `${fmt(norms[L][q], 3)} after layer ${L - 1} (× ${fmt(grow, 2)}).`;
      const title = ui.residualSection.querySelector('h2')?.textContent || 'The residual stream';
      const residualSvg = () => gridsSvg({ heading: `${title}: each token's ‖x‖ at each depth`, label: `${title}: attention-trace`, doc,
        sentence: typedSentence(), grids: [{ caption: '‖x‖ of each token (rows) after each layer (columns)',
          rows: tokens.map((t) => t.text), cols: labels, queryRow: q, markCol: doc.layer + 1,
          cells: tokens.map((t, i) => norms.map((byToken, d) => ({ t: unit(byToken[i], range), text: fmt(byToken[i], 3),
            title: `‖x${BLOCK.subscriptDigits(d)}‖ of ${quoted(t.text)} = ${fmt(byToken[i], 6)}` }))) }],
        notes: [sentence, `The dashed column is the layer shown (${labels[doc.layer + 1]}).`],
        desc: 'Rows are tokens, columns the depths of the residual stream, each cell the vector\'s length.' });
      ui.residualBody.replaceChildren(h('div', { class: 'table-scroll' }, table),
        h('p', { class: 'explain', text: `${sentence} The column of the layer shown is marked.` }),
        figureButtons('residual', 'the residual stream\'s lengths', residualSvg));
    }

    // -- present mode

    /**
     * Present mode: one stage at a time (trace.js's presentSlides), the slide in state.slide (an id; null or unknown:
     * the first). The walkthrough keeps the stage's rows, the maps the stage's map; every other part of the page that
     * the slide does not name is set aside. Out of present mode everything shows. Returns the slides and the index
     * of the one shown (or null).
     */
    function renderPresent() {
      const root = document.documentElement;
      const off = (el, hide) => el.classList.toggle('present-off', hide);
      if (!state.present || !state.main) {
        for (const el of document.querySelectorAll('.present-off')) off(el, false);
        delete root.dataset.slide;
        ui.results.classList.remove('present-split');
        return null;
      }
      const slides = presentSlides(state.main.doc);
      let at = slides.findIndex((sl) => sl.id === state.slide);
      if (at < 0) at = 0;
      const slide = slides[at];
      root.dataset.slide = slide.id;
      const maps = slide.parts.filter((p) => p.startsWith('map:')).map((p) => p.slice(4));
      for (const el of document.querySelectorAll('#results [data-present]')) {
        const part = el.dataset.present;
        const shown = part === 'walkthrough' ? slide.rows.length > 0 : part === 'maps' ? maps.length > 0 || slide.parts.includes('heads')
          : slide.parts.includes(part);
        off(el, !shown);
      }
      for (const tr of ui.walkthrough.querySelectorAll('.walkthrough-table tbody > tr[data-stage]')) off(tr, !slide.rows.includes(tr.dataset.stage));
      const explainLine = ui.walkthrough.querySelector(':scope > .explain');
      if (explainLine) off(explainLine, !slide.rows.includes('weights'));
      for (const fig of ui.maps.querySelectorAll('figure.heatmap')) off(fig, !maps.includes(fig.dataset.stage));
      for (const el of ui.maps.parentElement.querySelectorAll(':scope > .section-lede, :scope > #colour-scale-hint, :scope > #maps-readout')) {
        off(el, maps.length === 0);
      }
      off(ui.thumbs, !slide.parts.includes('heads'));
      // The walkthrough's row beside the stage's figures (style.css), when the slide has both.
      ui.results.classList.toggle('present-split', slide.rows.length > 0 && (maps.length > 0 || slide.parts.length > 0));
      return { slides, at };
    }

    return {
      renderStatus, renderFooter, renderSelection, renderPickers, syncPickers, renderDecode, renderSaturation, renderPresent,
      markOverflow, renderBlock, renderResidual, renderNextToken,
    };
  }

  globalThis.AttentionTrace.render = Object.freeze({ h, svgEl, spoken, sub, shade, vec, create });
})();
