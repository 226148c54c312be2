/*
 * attention-trace viewer: reading a /trace answer. Pure: no DOM, no state.
 *
 * The tokens along the key axis (the context's, in cross-attention), the K/V head a query head reads (grouped-query
 * attention), how much of a long trace the page draws, the file name of an export (service/offline_page.py
 * names the HTML file alike, export_filename), present mode's slides, and a stack of Transformer blocks: whether a
 * trace is one, how many layers it has, and one layer of it as a one-layer answer (layerView), so that every section
 * that draws one attention layer draws the chosen layer of a stack unchanged.
 *
 * Adds `trace` to globalThis.AttentionTrace; tests/js/trace.test.js runs it under Node.
 */
'use strict';

(() => {
  /** More tokens than this: the maps draw the first 48 only (the JSON download has them all). */
  const HEATMAP_MAX_TOKENS = 48;
  /** More tokens than this: cells show colour only; the readout (and the SVG's <title>) has the value. */
  const CELL_NUMBERS_MAX_TOKENS = 12;

  /** The tokens along the key axis: the context's in cross-attention, else the sentence's. */
  const keyTokensOf = (doc) => doc.context_tokens || doc.tokens;
  const isCross = (doc) => Array.isArray(doc.context_tokens);

  /** A stack of blocks: its per-layer stages carry a leading `layer` axis (the service's `weights` always does). */
  const isStack = (doc) => doc.stages?.weights?.axes?.[0] === 'layer';
  /** How many layers a trace has: 1 for attention alone. */
  const numLayers = (doc) => (isStack(doc) ? doc.stages.weights.shape[0] : 1);

  /**
   * Layer `layer` of a stack as a one-layer answer: every stage with a leading `layer` axis cut to that layer
   * (axes, shape and values), the stats too ([layer, head, query] → [head, query]); the stack's own stages
   * (`residual_stream` over depth, the final norm) and everything else as they are. `layer` is clamped to the
   * stack; `full` is the answer as sent, `layer` the layer shown. Attention alone: the answer itself.
   */
  function layerView(doc, layer) {
    if (!isStack(doc)) return doc;
    const l = Math.min(Math.max(Number.isInteger(layer) ? layer : 0, 0), numLayers(doc) - 1);
    const stages = {};
    for (const [id, st] of Object.entries(doc.stages)) {
      stages[id] = st.axes?.[0] === 'layer'
        ? { ...st, axes: st.axes.slice(1), shape: st.shape.slice(1), values: st.values[l] } // [layer, …] → [ …]
        : st;
    }
    // The stats gain the layer axis too ([layer, head, query]); read by depth, whatever the axes say.
    const stats = doc.stats && Array.isArray(doc.stats.entropy?.[0]?.[0])
      ? { ...doc.stats, axes: ['head', 'query'], entropy: doc.stats.entropy[l], max_weight: doc.stats.max_weight[l] }
      : doc.stats;
    return { ...doc, stages, stats, layer: l, full: doc };
  }

  /** Which K/V head query head `hd` reads (itself, without GQA). */
  function kvHeadOf(cfg, hd) {
    const groups = cfg.query_heads_of_kv_head;
    if (!groups) return hd;
    const g = groups.findIndex((heads) => heads.includes(hd));
    return g < 0 ? 0 : g;
  }

  /**
   * The file name (without extension) of an export of a trace:
   * attention-trace_<sentence>_d<d_model>_h<heads>_seed<seed>[_unscaled][_causal][_rope][_kv…][_w…][_cross][_decode]
   * [_<block>_L<layers>].
   */
  function exportName(doc, body) {
    const cfg = doc.config;
    const text = typeof body.sentence === 'string' ? body.sentence : doc.tokens.map((t) => t.text).join(' ');
    const slug = text.trim().toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '').slice(0, 40) || 'trace';
    const variant = [cfg.positional_encoding === 'rope' ? '_rope' : '', cfg.num_kv_heads !== undefined ? `_kv${cfg.num_kv_heads}` : '',
      cfg.window !== undefined ? `_w${cfg.window}` : '', isCross(doc) ? '_cross' : '', cfg.decode ? '_decode' : '',
      cfg.num_layers !== undefined ? `_${cfg.block || 'block'}_L${cfg.num_layers}` : ''].join('');
    return `attention-trace_${slug}_d${cfg.d_model}_h${cfg.num_heads}_seed${cfg.seed}${cfg.scale ? '' : '_unscaled'}`
      + `${cfg.causal ? '_causal' : ''}${variant}`;
  }

  /**
   * Present mode's slides for a trace: one stage of the layer at a time, in the order a lecture tells it. Each is
   * {id, title, rows, parts}: `rows` the walkthrough's rows it shows (their data-stage), `parts` the rest of the page
   * it shows: 'matrices' (Q, Kᵀ and QKᵀ), 'map:<stage>' (one attention map), 'heads' (every head's weights),
   * 'explain', 'saturation', 'kv', 'multihead', 'decode'. A stage the trace does not have has no slide.
   */
  function presentSlides(doc) {
    const cfg = doc.config;
    const rope = cfg.positional_encoding === 'rope';
    const qk = rope ? 'RoPE(Q)·RoPE(K)ᵀ' : 'Q·Kᵀ';
    const masked = !!doc.stages.masked_scores;
    const gqa = cfg.num_kv_heads !== undefined;
    const stack = isStack(doc.full || doc); // one layer of a stack (layerView) is still a stack's
    const slides = [
      { id: 'input', title: isCross(doc) ? 'Embed the sentence and the context' : 'Embed the tokens',
        rows: ['input', 'context_input'], parts: [] },
      { id: 'project', title: rope ? 'Project to Q, K and V, then rotate Q and K' : 'Project to Q, K and V',
        rows: ['project', 'rotate'], parts: ['matrices', ...(gqa ? ['kv'] : [])] },
      { id: 'scores', title: `Score: ${qk}`, rows: ['scores'], parts: ['matrices', 'map:scores'] },
      { id: 'scaled_scores', title: cfg.scale ? 'Scale by √d_k' : 'Scale (off: divide by 1)', rows: ['scaled_scores'],
        parts: ['map:scaled_scores', 'saturation'] },
      masked ? { id: 'masked_scores', title: cfg.window !== undefined ? 'Mask (sliding window)' : 'Mask (causal)',
        rows: ['masked_scores'], parts: ['map:masked_scores'] } : null,
      { id: 'weights', title: 'Softmax: the weights', rows: ['weights'], parts: ['map:weights', 'heads', 'explain'] },
      { id: 'context', title: 'Weight the values: Σ w·V', rows: ['context'], parts: ['explain'] },
      { id: 'concat', title: cfg.num_heads > 1 ? 'Concatenate the heads, then W_O' : 'Concat and W_O',
        rows: ['concat', 'output'], parts: ['multihead'] },
      Array.isArray(doc.decode) ? { id: 'decode', title: 'KV-cache decoding', rows: [], parts: ['decode'] } : null,
      // A stack: the block around the attention (diagram and the stage shown), then the residual stream's depth.
      stack ? { id: 'block', title: 'The block: norms, residual sums and the feed-forward network', rows: [],
        parts: ['block'] } : null,
      stack ? { id: 'residual', title: 'The residual stream, layer by layer', rows: [], parts: ['residual'] } : null,
      // The language-model head: the next token's probabilities (the temperature slider, the generate step).
      Array.isArray((doc.full || doc).vocabulary) ? { id: 'next-token', title: 'Predict the next token', rows: [],
        parts: ['next-token'] } : null,
    ];
    return slides.filter(Boolean);
  }

  globalThis.AttentionTrace ??= {};
  globalThis.AttentionTrace.trace = Object.freeze({
    HEATMAP_MAX_TOKENS, CELL_NUMBERS_MAX_TOKENS, keyTokensOf, isCross, kvHeadOf, exportName, presentSlides,
    isStack, numLayers, layerView,
  });
})();
