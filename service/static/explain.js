/*
 * attention-trace viewer: one cell, number by number.
 *
 * A map's cell clicked (or Enter on it): POST /explain with the trace's request plus head, query and key (and, in a
 * stack of blocks, the layer shown), and the answer drawn generically from its `steps` (formula = value, with the
 * values it lists). A masked cell says so: its weight is the mask's 0, never a probability the softmax gave a real
 * key. A saved page has no service to ask: it computes the same answer from its embedded trace (cell.js, over the
 * layer shown) and draws it with the same code.
 *
 * app.js calls create(view) once: view.state (the trace on screen; `explain`, the cell explained, which the maps
 * mark), view.ui (the explain section, and the maps to unmark) and view.saved.
 *
 * Adds `explain` to globalThis.AttentionTrace (after format.js, trace.js, cell.js, api.js and render.js).
 */
'use strict';

(() => {
  const { fmt, pct, fmtSmall, fmtExp, quoted } = globalThis.AttentionTrace.format;
  const { keyTokensOf } = globalThis.AttentionTrace.trace;
  const { ServiceError, ENDPOINTS, postJson } = globalThis.AttentionTrace.api;
  const { h, vec } = globalThis.AttentionTrace.render;
  const cell = globalThis.AttentionTrace.cell;

  const STEP_NAMES = {
    products: 'Products', score: 'Score', scaled: 'Scale', row_max: 'Row max', exp: 'Exponential',
    denominator: 'Denominator', weight: 'Weight', contributions: 'Contributions',
  };
  /** The steps whose note is about floating point (BLAS's order of additions, numpy's exp): behind a toggle. */
  const FLOAT_NOTES = new Set(['score', 'exp', 'denominator', 'contributions']);

  function create(view) {
    const { state, ui } = view;

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

    /**
     * Ask the service to explain one cell of the trace on screen: the request as traced, plus head, query, key, and
     * in a stack of blocks the layer shown (/explain explains that layer's attention). A saved page has no service:
     * it computes the same answer from the trace on screen (cell.js, over the layer shown: trace.js, layerView).
     */
    async function explainCell(head, query, key) {
      if (!state.main) return;
      const { doc, body } = state.main;
      const keyTokens = keyTokensOf(doc);
      if (view.saved) { // no service: the same answer, from the trace
        if (state.explainController) state.explainController.abort();
        state.explainController = null;
        state.explain = { head, query, key };
        renderExplain(cell.explainCell(doc, head, query, key));
        return;
      }
      const layer = Number.isInteger(doc.layer) ? doc.layer : null; // a stack's layer on screen; null: one layer
      const cellOf = layer === null ? { head, query, key } : { layer, head, query, key };
      if (state.explainController) state.explainController.abort();
      const controller = new AbortController();
      state.explainController = controller;
      state.explain = { head, query, key };
      ui.explainSection.setAttribute('aria-busy', 'true');
      ui.explainStatus.textContent = `Explaining ${layer === null ? '' : `layer ${layer}, `}head ${head}: query ${quoted(doc.tokens[query].text)} → key ${quoted(keyTokens[key].text)}…`;
      let answer;
      try {
        answer = await postJson(ENDPOINTS.explain, { ...body, ...cellOf }, controller.signal);
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
      const floatNotes = [];
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
        // The floating-point notes (which bits BLAS or numpy may round otherwise) go below, behind a toggle; a
        // masked cell's note on its score stays (it keeps its score: the mask acts in the softmax).
        const floating = FLOAT_NOTES.has(step.id) && !(masked && step.id === 'exp');
        const note = floating
          ? (masked && step.id === 'score' ? 'masked cells keep their score (the mask acts in the softmax)' : null)
          : step.note;
        if (floating && step.note) floatNotes.push(h('li', { data: { step: step.id } }, h('strong', { text: `${STEP_NAMES[step.id]}: ` }), step.note));
        const sum = step.id === 'contributions' && Array.isArray(step.vector)
          ? h('div', { class: 'vec-line explain-sum', data: { part: 'explain-context' } },
            h('span', { class: 'vec-name', text: `context[${x.head}, ${x.query}] = Σ =` }), vec(step.vector, 4, 8))
          : null;
        return h('tr', { data: { step: step.id } },
          h('th', { scope: 'row', class: 'wt-stage' }, STEP_NAMES[step.id] || step.id,
            step.stage ? h('span', { class: 'row-note', text: step.stage }) : null),
          h('td', { class: 'wt-op' }, h('code', { text: step.formula || '' }),
            note ? h('span', { class: 'op-note explain-note', text: ` ${note}` }) : null),
          h('td', { class: 'wt-result' }, shown ? h('span', { class: 'explain-eq' }, '= ', shown) : null, list, sum));
      });
      const weightStep = steps.find((s) => s.id === 'weight');
      const summary = masked
        ? `masked${x.mask_reason ? ` (${x.mask_reason})` : ''}`
        : weightStep && typeof weightStep.value === 'number' ? `weight ${pct(weightStep.value, 2)}` : '';
      const layer = Number.isInteger(state.main?.doc.layer) ? `Layer ${state.main.doc.layer}, head` : 'Head';
      ui.explainStatus.textContent = `${layer} ${x.head}: query ${x.query} ${quoted(x.query_token)} → key ${x.key} ${quoted(keyText)}`
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
            ? ` (weight difference ${fmtExp(x.decode.weight_difference, 1)})` : '') + '.')
        : null;
      const notes = floatNotes.length ? h('details', { class: 'float-notes' },
        h('summary', { text: 'Floating-point notes: why the last digits of a recomputation can differ' }),
        h('ul', {}, floatNotes)) : null;
      const source = view.saved ? h('p', { class: 'hint', data: { part: 'explain-source' } },
        'Computed in this page from the embedded trace, as the service\'s POST /explain computes it: the stages\' numbers '
        + 'are the trace\'s own; an exponential may differ from the service\'s in its last bit.') : null;
      ui.explainBody.replaceChildren(...[banner, facts, h('div', { class: 'table-scroll' }, table), decodeNote, notes, source]
        .filter(Boolean));
    }

    return { explainCell, clearExplain };
  }

  globalThis.AttentionTrace.explain = Object.freeze({ create });
})();
