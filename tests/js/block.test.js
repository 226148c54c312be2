/* block.js and trace.js's stack helpers: which block an answer is, its diagram, one layer of it, the residual norms. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { load } = require('./load.js');

const AT = load('format.js', 'trace.js', 'fields.js', 'url-state.js', 'svg.js', 'cell.js', 'block.js');
const B = AT.block;
const T = AT.trace;

// A gpt2 stack of 3 layers (d_model 8, 2 heads, "the cat sat on") as the service answers it, and numpy's norms of its
// residual stream (the fixture says how it was made; tests/test_viewer_js.py checks it is still the engine's).
const FIXTURE = JSON.parse(fs.readFileSync(path.join(__dirname, 'fixtures', 'gpt2-stack.json'), 'utf8'));
const DOC = FIXTURE.doc;

const stagesOf = (...ids) => Object.fromEntries(ids.map((id) => [id, {}]));
const PRE_LN = stagesOf('norm1_mean', 'norm1_variance', 'norm1', 'output', 'residual1', 'norm2_mean', 'norm2_variance',
  'norm2', 'ffn_pre_activation', 'ffn_activation', 'ffn_output', 'residual2', 'residual_stream', 'final_norm_mean',
  'final_norm_variance', 'final_norm');
const POST_LN = stagesOf('output', 'residual1', 'norm1_mean', 'norm1_variance', 'norm1', 'ffn_pre_activation',
  'ffn_activation', 'ffn_output', 'residual2', 'norm2_mean', 'norm2_variance', 'norm2', 'residual_stream');
const LLAMA = stagesOf('norm1_mean_square', 'norm1', 'output', 'residual1', 'norm2_mean_square', 'norm2',
  'ffn_pre_activation', 'ffn_up', 'ffn_activation', 'ffn_gated', 'ffn_output', 'residual2', 'residual_stream',
  'final_norm_mean_square', 'final_norm');

test('blockOf: pre-norm has the final norm, RMSNorm a mean square, SwiGLU a gate; the config wins when it says', () => {
  assert.deepEqual(B.blockOf({ stages: PRE_LN, config: {} }, { block: 'gpt2' }),
    { pre: true, normKind: 'layer_norm', ffn: 'gelu_tanh', finalNorm: true, preset: 'gpt2' });
  assert.equal(B.blockOf({ stages: PRE_LN, config: {} }, { block: 'gpt2', ffn: 'relu' }).ffn, 'relu', 'the request\'s own');
  assert.deepEqual(B.blockOf({ stages: POST_LN, config: {} }),
    { pre: false, normKind: 'layer_norm', ffn: null, finalNorm: false, preset: null });
  assert.deepEqual(B.blockOf({ stages: LLAMA, config: { block: 'llama' } }),
    { pre: true, normKind: 'rms_norm', ffn: 'swiglu', finalNorm: true, preset: 'llama' });
  const echoed = B.blockOf({ stages: POST_LN, config: { norm_position: 'post', norm: 'rms_norm', ffn: 'gelu', block: 'vaswani2017' } });
  assert.deepEqual(echoed, { pre: false, normKind: 'rms_norm', ffn: 'gelu', finalNorm: false, preset: 'vaswani2017' });
  assert.equal(B.blockOf({ stages: DOC.stages, config: DOC.config }).pre, true, 'the real gpt2 answer is pre-norm');
});

test('the diagram\'s order: norm → attention → add → norm → FFN → add in pre-norm, the norms after the adds in post-norm', () => {
  const pre = B.blockDiagram(B.blockOf({ stages: PRE_LN, config: {} }), { numLayers: 3, layer: 1, numHeads: 2, causal: true });
  assert.deepEqual(pre.order, ['norm1', 'attention', 'residual1', 'norm2', 'ffn', 'residual2', 'final_norm']);
  const post = B.blockDiagram(B.blockOf({ stages: POST_LN, config: {} }), { numLayers: 2, layer: 0 });
  assert.deepEqual(post.order, ['attention', 'residual1', 'norm1', 'ffn', 'residual2', 'norm2'], 'no final norm');
  for (const d of [pre, post]) {
    assert.deepEqual(d.boxes.map((b) => b.id), d.order, 'one box a step, in order');
    // Top to bottom, never overlapping, inside the drawing.
    const spans = d.boxes.map((b) => (b.kind === 'add' ? [b.y - b.h / 2, b.y + b.h / 2] : [b.y, b.y + b.h]));
    for (let i = 1; i < spans.length; i += 1) assert.ok(spans[i][0] > spans[i - 1][1], `${d.order[i]} below ${d.order[i - 1]}`);
    assert.ok(spans.at(-1)[1] <= d.height && d.boxes.every((b) => b.x + (b.kind === 'add' ? b.w / 2 : b.w) <= d.width));
    assert.deepEqual(d.boxes.filter((b) => b.kind === 'add').map((b) => b.id), ['residual1', 'residual2']);
  }
  assert.equal(pre.boxes.find((b) => b.id === 'attention').label, 'Masked multi-head attention');
  assert.equal(post.boxes.find((b) => b.id === 'attention').label, 'Multi-head attention');
  assert.equal(pre.boxes.find((b) => b.id === 'norm1').label, 'LayerNorm₁');
  assert.equal(pre.boxes.find((b) => b.id === 'final_norm').detail, 'after the last layer (2), once');
  const llama = B.blockDiagram(B.blockOf({ stages: LLAMA, config: {} }));
  assert.deepEqual(llama.boxes.filter((b) => b.kind === 'norm').map((b) => b.label), ['RMSNorm₁', 'RMSNorm₂', 'Final RMSNorm']);
  assert.equal(llama.boxes.find((b) => b.id === 'ffn').label, 'Feed-forward (SwiGLU)');
  assert.deepEqual(pre.labels.map((l) => l.text).slice(0, 2), ['x₁: layer 1\'s input', 'x₂: layer 1\'s output']);
});

test('the residual connections: each add closes the connection that skipped its sublayer', () => {
  const skips = (d) => d.arrows.filter((a) => a.kind === 'residual').map((a) => {
    const [from, , , to] = a.points;
    // The branch point is on the arrow into the first box the connection skips; it ends at its add's centre row.
    const skipped = d.boxes.find((b) => b.kind !== 'add' && b.y > from[1] && b.y - from[1] < 30);
    const add = d.boxes.find((b) => b.kind === 'add' && b.y === to[1]);
    return [skipped.id, add.id];
  });
  const pre = B.blockDiagram(B.blockOf({ stages: PRE_LN, config: {} }));
  const post = B.blockDiagram(B.blockOf({ stages: POST_LN, config: {} }));
  assert.deepEqual(skips(pre), [['norm1', 'residual1'], ['norm2', 'residual2']], 'pre-norm: the norm is inside the branch');
  assert.deepEqual(skips(post), [['attention', 'residual1'], ['ffn', 'residual2']], 'post-norm: the norm is on the stream');
  for (const d of [pre, post]) {
    const main = d.arrows.filter((a) => a.kind === 'main');
    assert.equal(main.length, d.order.filter((id) => id !== 'final_norm').length + 1, 'an arrow into each box, and out');
    for (const a of d.arrows) for (const [x, y] of a.points) assert.ok(x >= 0 && x <= d.width && y >= 0 && y <= d.height);
  }
});

test('boxStages: each box shows the stages the answer has, the statistics first', () => {
  assert.deepEqual(B.boxStages('norm1', PRE_LN), ['norm1_mean', 'norm1_variance', 'norm1']);
  assert.deepEqual(B.boxStages('norm2', LLAMA), ['norm2_mean_square', 'norm2']);
  assert.deepEqual(B.boxStages('ffn', LLAMA), ['ffn_pre_activation', 'ffn_up', 'ffn_activation', 'ffn_gated', 'ffn_output']);
  assert.deepEqual(B.boxStages('ffn', POST_LN), ['ffn_pre_activation', 'ffn_activation', 'ffn_output']);
  assert.deepEqual(B.boxStages('attention', PRE_LN), ['output']);
  assert.deepEqual(B.boxStages('final_norm', POST_LN), []);
  assert.deepEqual(B.boxStages('nope', PRE_LN), []);
  assert.deepEqual(['norm1_mean', 'norm1_variance', 'final_norm_mean_square', 'norm1', 'residual1'].map(B.isStatStage),
    [true, true, true, false, false]);
});

test('residualNorms: each token\'s ‖x‖ at each depth, as numpy computes them', () => {
  assert.deepEqual(B.residualNorms([[[3, 4], [0, 0]], [[1, 0], [-5, 12]]]), [[5, 0], [1, 13]]);
  const got = B.residualNorms(DOC.stages.residual_stream.values);
  const want = FIXTURE.residual_norms; // numpy.linalg.norm(residual_stream, axis=-1)
  assert.equal(got.length, 4, 'the input and 3 layers');
  assert.equal(got[0].length, 4, 'four tokens');
  for (let d = 0; d < want.length; d += 1) {
    for (let i = 0; i < want[d].length; i += 1) {
      assert.ok(Math.abs(got[d][i] - want[d][i]) <= 1e-12 * want[d][i], `depth ${d}, token ${i}: ${got[d][i]} vs ${want[d][i]}`);
    }
  }
  assert.deepEqual(B.depthLabels(3), ['x₀ input', 'x₁ after layer 0', 'x₂ after layer 1', 'x₃ after layer 2']);
  assert.equal(B.subscriptDigits(12), '₁₂');
});

test('layerView: one layer of a stack as a one-layer answer; attention alone is the answer itself', () => {
  assert.equal(T.isStack(DOC), true);
  assert.equal(T.numLayers(DOC), 3);
  const v = T.layerView(DOC, 2);
  assert.equal(v.layer, 2);
  assert.equal(v.full, DOC);
  assert.deepEqual(v.stages.weights.axes, ['head', 'query', 'key']);
  assert.deepEqual(v.stages.weights.shape, [2, 4, 4]);
  assert.deepEqual(v.stages.weights.values, DOC.stages.weights.values[2]);
  assert.deepEqual(v.stages.norm1.values, DOC.stages.norm1.values[2]);
  assert.equal(v.stages.residual_stream, DOC.stages.residual_stream, 'over depth: the stack\'s own');
  assert.equal(v.stages.final_norm, DOC.stages.final_norm);
  assert.equal(v.stages.input, DOC.stages.input);
  assert.deepEqual(v.stats.entropy, DOC.stats.entropy[2]);
  assert.deepEqual(v.stats.max_weight, DOC.stats.max_weight[2]);
  assert.deepEqual(v.stats.axes, ['head', 'query']);
  assert.deepEqual(DOC.stages.weights.axes, ['layer', 'head', 'query', 'key'], 'the answer is left alone');
  assert.equal(T.layerView(DOC, 9).layer, 2, 'clamped to the stack');
  assert.equal(T.layerView(DOC, null).layer, 0);
  const one = { stages: { weights: { axes: ['head', 'query', 'key'], shape: [1, 2, 2], values: [] } }, stats: {} };
  assert.equal(T.isStack(one), false);
  assert.equal(T.numLayers(one), 1);
  assert.equal(T.layerView(one, 2), one);
});

test('present mode: a stack adds the block and the residual stream after the layer\'s own stages', () => {
  const doc = { ...DOC, config: { ...DOC.config, num_heads: 2 }, stages: { ...DOC.stages, scores: {}, masked_scores: {} } };
  const ids = T.presentSlides(doc).map((s) => s.id);
  assert.deepEqual(ids.slice(-3), ['concat', 'block', 'residual']);
  assert.deepEqual(T.presentSlides(doc).find((s) => s.id === 'block').parts, ['block']);
  assert.deepEqual(T.presentSlides(T.layerView(doc, 1)).map((s) => s.id), ids, 'the layer shown is a stack\'s');
  assert.ok(!T.presentSlides({ ...doc, stages: { scores: {}, weights: {} } }).some((s) => s.id === 'block'));
});

test('the diagram writes the norms as the block has them: LN₁(x) under LayerNorm, RMSNorm₁(x) under RMSNorm', () => {
  const detail = (d, id) => d.boxes.find((b) => b.id === id).detail;
  const llama = B.blockDiagram(B.blockOf({ stages: LLAMA, config: {} }), { numHeads: 2 });
  assert.equal(detail(llama, 'attention'), '2 heads · reads RMSNorm₁(x)');
  assert.equal(detail(llama, 'residual1'), 'x + MHA(RMSNorm₁(x))');
  assert.equal(detail(llama, 'ffn'), 'reads RMSNorm₂(h)');
  assert.ok(!llama.boxes.some((b) => /LN₁|LN₂/.test(b.detail.replace(/RMSNorm/g, ''))), 'no LayerNorm name under RMSNorm');
  const gpt2 = B.blockDiagram(B.blockOf({ stages: PRE_LN, config: {} }), { numHeads: 2 });
  assert.equal(detail(gpt2, 'attention'), '2 heads · reads LN₁(x)');
  assert.equal(detail(gpt2, 'residual2'), 'h + FFN(LN₂(h))');
});
