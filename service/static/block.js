/*
 * attention-trace viewer: a Transformer block, as data. Pure: no DOM, no state.
 *
 * A stack's answer (trace.js, isStack) has the block's stages around the attention: the norms (their statistics
 * and the normalised x), the two residual sums, the feed-forward network's stages, `residual_stream` over depth and,
 * in pre-norm, the final norm. From an answer this file says which block it is (blockOf: the norm's kind and place,
 * read from the stages the answer has), lays out its diagram (blockDiagram: the boxes in the order the layer
 * computes them, pre-norm  norm → attention → add → norm → FFN → add,  post-norm  attention → add → norm → FFN →
 * add → norm, then the final norm after the last layer, each box with the residual connection it closes), names the
 * stages each box shows (boxStages), and computes the one number the page derives from a stack: each token's
 * vector length ‖x‖ at each depth of the residual stream (residualNorms; tests/test_viewer_js.py compares it with
 * numpy).
 *
 * Adds `block` to globalThis.AttentionTrace (after format.js and trace.js); tests/js/block.test.js runs it under
 * Node; render.js draws the diagram as SVG.
 */
'use strict';

(() => {
  /** The boxes a block can have, by id: the stages each shows, in the order the layer computes them. */
  const BOX_STAGES = Object.freeze({
    norm1: ['norm1_mean', 'norm1_variance', 'norm1_mean_square', 'norm1'],
    attention: ['output'],
    residual1: ['residual1'],
    norm2: ['norm2_mean', 'norm2_variance', 'norm2_mean_square', 'norm2'],
    ffn: ['ffn_pre_activation', 'ffn_up', 'ffn_activation', 'ffn_gated', 'ffn_output'],
    residual2: ['residual2'],
    final_norm: ['final_norm_mean', 'final_norm_variance', 'final_norm_mean_square', 'final_norm'],
  });

  /** The statistics stages of a norm ([token] or [layer, token]): shown as columns beside the normalised x. */
  const isStatStage = (id) => /_(mean|variance|mean_square)$/.test(id);

  const FFN_NAMES = Object.freeze({ relu: 'ReLU', gelu: 'GELU', gelu_tanh: 'GELU (tanh)', swiglu: 'SwiGLU' });

  /** Each preset's feed-forward network (engine/layer.py's BLOCK_PRESETS; tests/test_viewer_js.py compares them). */
  const PRESET_FFN = Object.freeze({ vaswani2017: 'relu', gpt2: 'gelu_tanh', llama: 'swiglu' });

  /**
   * Which block an answer's stages describe: {pre, normKind, ffn, finalNorm, preset}. Pre-norm has the final norm
   * (GPT-2's ln_f, Llama's norm) and post-norm has none (docs/engine.md, "The stages of a block"); RMSNorm has a
   * mean square where LayerNorm has a mean and a variance; SwiGLU has a gate. The config's own fields, when the
   * answer echoes them, are taken as they are; the FFN's kind is the config's, the request's or its preset's.
   */
  function blockOf(doc, body = {}) {
    const S = doc.stages;
    const cfg = doc.config || {};
    const finalNorm = 'final_norm' in S;
    const pre = cfg.norm_position ? cfg.norm_position === 'pre' : finalNorm;
    const normKind = cfg.norm || ('norm1_mean_square' in S ? 'rms_norm' : 'layer_norm');
    const preset = typeof cfg.block === 'string' ? cfg.block : typeof body.block === 'string' ? body.block : null;
    // The request's own ffn, else its preset's (a request's block fields override the preset's choices).
    const ffn = cfg.ffn || body.ffn || PRESET_FFN[preset] || ('ffn_gated' in S ? 'swiglu' : null);
    return { pre, normKind, ffn, finalNorm, preset };
  }

  /** The stages box `id` shows that the answer has (its stats first, then its matrices). */
  const boxStages = (id, stages) => (BOX_STAGES[id] || []).filter((sid) => sid in stages);

  // Geometry, in the SVG's user units: one column of boxes, the residual connections in a lane on its right.
  const COL_X = 16;
  const COL_W = 260;
  const BOX_H = 40;
  const ADD_R = 14;
  const GAP = 22;
  const LANE_X = COL_X + COL_W + 34;
  const WIDTH = LANE_X + 24;
  const LABEL_H = 18;

  /**
   * The diagram of one layer of `block` (blockOf's answer), top to bottom as the layer computes: {width, height,
   * boxes, arrows, labels, order}. A box is {id, kind ('norm', 'attention', 'add', 'ffn'), label, detail, x, y, w, h}
   * (an add is a circle: x, y its centre's, w = h its diameter); an arrow is {kind ('main', 'residual'), points:
   * [[x, y], …]}; `order` the boxes' ids in the order the layer computes them (the final norm last, after the stack).
   * `opts`: {causal, numHeads, layer, numLayers}, for the labels.
   */
  function blockDiagram(block, opts = {}) {
    const norm = block.normKind === 'rms_norm' ? 'RMSNorm' : 'LayerNorm';
    const ffnName = FFN_NAMES[block.ffn] ? ` (${FFN_NAMES[block.ffn]})` : '';
    const heads = opts.numHeads ? `${opts.numHeads} head${opts.numHeads === 1 ? '' : 's'}` : '';
    const layer = Number.isInteger(opts.layer) ? opts.layer : 0;
    // The norms as the formulas write them: LN₁(x) under LayerNorm, RMSNorm₁(x) under RMSNorm.
    const [n1, n2] = block.normKind === 'rms_norm' ? ['RMSNorm₁', 'RMSNorm₂'] : ['LN₁', 'LN₂'];
    const spec = {
      norm1: { kind: 'norm', label: `${norm}₁`, detail: block.pre ? 'normalise the layer\'s input' : 'normalise the first sum' },
      attention: { kind: 'attention', label: `${opts.causal ? 'Masked multi' : 'Multi'}-head attention`,
        detail: [heads, block.pre ? `reads ${n1}(x)` : 'reads x'].filter(Boolean).join(' · ') },
      residual1: { kind: 'add', label: '+', detail: block.pre ? `x + MHA(${n1}(x))` : 'x + MHA(x)' },
      norm2: { kind: 'norm', label: `${norm}₂`, detail: block.pre ? 'normalise the first sum' : 'the layer\'s output' },
      ffn: { kind: 'ffn', label: `Feed-forward${ffnName}`, detail: block.pre ? `reads ${n2}(h)` : `reads ${n1}(y)` },
      residual2: { kind: 'add', label: '+', detail: block.pre ? `h + FFN(${n2}(h))` : 'h + FFN(h)' },
      final_norm: { kind: 'norm', label: `Final ${norm}`, detail: 'after the last layer' },
    };
    // The order the layer computes, and where each residual connection branches off the stream (the box it skips
    // from: its input is the branch point).
    const order = block.pre
      ? ['norm1', 'attention', 'residual1', 'norm2', 'ffn', 'residual2']
      : ['attention', 'residual1', 'norm1', 'ffn', 'residual2', 'norm2'];
    const skipFrom = block.pre ? { residual1: 'norm1', residual2: 'norm2' } : { residual1: 'attention', residual2: 'ffn' };

    const cx = COL_X + COL_W / 2;
    const boxes = [];
    const arrows = [];
    const labels = [{ id: 'in', text: `x${subscriptDigits(layer)}: layer ${layer}'s input`, x: cx, y: LABEL_H - 4 }];
    let y = LABEL_H; // the bottom of what is drawn so far
    const top = {};
    for (const id of order) {
      const s = spec[id];
      const h = s.kind === 'add' ? 2 * ADD_R : BOX_H;
      const boxY = y + GAP;
      arrows.push({ kind: 'main', points: [[cx, y], [cx, boxY]] });
      top[id] = y + GAP / 2; // the branch point on the arrow into this box
      if (s.kind === 'add') boxes.push({ id, ...s, x: cx, y: boxY + ADD_R, w: h, h });
      else boxes.push({ id, ...s, x: COL_X, y: boxY, w: COL_W, h });
      y = boxY + h;
    }
    for (const [add, from] of Object.entries(skipFrom)) {
      const a = boxes.find((b) => b.id === add);
      arrows.push({ kind: 'residual', points: [[cx, top[from]], [LANE_X, top[from]], [LANE_X, a.y], [cx + ADD_R, a.y]] });
    }
    arrows.push({ kind: 'main', points: [[cx, y], [cx, y + GAP]] });
    y += GAP;
    labels.push({ id: 'out', text: `x${subscriptDigits(layer + 1)}: layer ${layer}'s output`, x: cx, y: y + LABEL_H - 4 });
    y += LABEL_H;
    const all = [...order];
    if (block.finalNorm) {
      const last = Number.isInteger(opts.numLayers) ? opts.numLayers - 1 : null;
      const s = { ...spec.final_norm, detail: last === null ? spec.final_norm.detail : `after the last layer (${last}), once` };
      labels.push({ id: 'stack', text: 'after the last layer:', x: cx, y: y + GAP - 6 });
      y += GAP;
      boxes.push({ id: 'final_norm', ...s, x: COL_X, y: y + 4, w: COL_W, h: BOX_H });
      y += 4 + BOX_H;
      all.push('final_norm');
    }
    return { width: WIDTH, height: y + 6, boxes, arrows, labels, order: all };
  }

  const SUBSCRIPT = '₀₁₂₃₄₅₆₇₈₉';
  function subscriptDigits(n) {
    return String(n).replace(/\d/g, (d) => SUBSCRIPT[Number(d)]);
  }

  /**
   * Each token's vector length at each depth of the residual stream: ‖x‖ = √(Σⱼ x[j]²), summed in order.
   * `values` is residual_stream's [depth, token, d_model]; the answer is [depth, token].
   */
  function residualNorms(values) {
    return values.map((rows) => rows.map((x) => {
      let s = 0;
      for (const v of x) s += v * v;
      return Math.sqrt(s);
    }));
  }

  /** The residual stream's depths, as the page labels them: x₀ the stack's input, then each layer's output. */
  const depthLabels = (numLayers) => Array.from({ length: numLayers + 1 },
    (_, d) => (d === 0 ? 'x₀ input' : `x${subscriptDigits(d)} after layer ${d - 1}`));

  globalThis.AttentionTrace.block = Object.freeze({
    BOX_STAGES, FFN_NAMES, PRESET_FFN, isStatStage, blockOf, boxStages, blockDiagram, residualNorms, depthLabels, subscriptDigits,
  });
})();
