/* cell.js: one cell, number by number, from a trace alone (the saved page's /explain). */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { load } = require('./load.js');

const C = load('format.js', 'trace.js', 'cell.js').cell;

test('pyRepr writes a token as Python\'s repr does (the engine\'s notes quote tokens so)', () => {
  assert.equal(C.pyRepr('cat'), "'cat'");
  assert.equal(C.pyRepr("didn't"), '"didn\'t"', 'a single quote inside: double quotes');
  assert.equal(C.pyRepr('say "hi" it\'s'), "'say \"hi\" it\\'s'", 'both inside: single quotes, escaped');
  assert.equal(C.pyRepr('a\\b'), "'a\\\\b'");
  assert.equal(C.pyRepr('tab\there\nand\r'), "'tab\\there\\nand\\r'");
  assert.equal(C.pyRepr('\u0007\u007f'), "'\\x07\\x7f'");
  assert.equal(C.pyRepr('a\u00a0b\u200bc'), "'a\\xa0b\\u200bc'", 'not printable: escaped');
  assert.equal(C.pyRepr('été 🐈 ##ing'), "'été 🐈 ##ing'", 'printable: as it is');
});

test('pyFloat writes a float as Python\'s repr does', () => {
  assert.equal(C.pyFloat(4.898979485566356), '4.898979485566356');
  assert.equal(C.pyFloat(2), '2.0');
  assert.equal(C.pyFloat(1), '1.0');
  assert.equal(C.pyFloat(0.5), '0.5');
  assert.equal(C.pyFloat(0.0001), '0.0001');
  assert.equal(C.pyFloat(0.00001), '1e-05');
  assert.equal(C.pyFloat(1.5e-7), '1.5e-07');
  assert.equal(C.pyFloat(1e16), '1e+16');
  assert.equal(C.pyFloat(123456789012345680), '1.2345678901234568e+17');
  assert.equal(C.pyFloat(1234567890123456), '1234567890123456.0');
  assert.equal(C.pyFloat(-2.5), '-2.5');
  assert.equal(C.pyFloat(0), '0.0');
  assert.equal(C.pyList([2, 3]), '[2, 3]');
});

test('pairwiseSum adds as numpy\'s sum does: in order below 8 terms, in 8 running sums up to 128, halves above', () => {
  assert.equal(C.pairwiseSum([]), 0);
  assert.equal(C.pairwiseSum([0.1, 0.2, 0.3]), (0 + 0.1 + 0.2) + 0.3);
  const a = Array.from({ length: 11 }, (_, i) => 1 / (i + 3));
  const r = a.slice(0, 8);
  const want = (((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])) + a[8]) + a[9] + a[10];
  assert.equal(C.pairwiseSum(a), want);
  const long = Array.from({ length: 300 }, (_, i) => Math.exp(-i / 7));
  assert.equal(C.pairwiseSum(long), C.pairwiseSum(long.slice(0, 144)) + C.pairwiseSum(long.slice(144)), '300 = 144 + 156');
  assert.deepEqual(C.sumInOrder([[1, 2], [3, 4], [5, 6]]), [9, 12]);
  assert.equal(C.sumInOrder([0.1, 0.2, 0.3]), 0.1 + 0.2 + 0.3);
});

/** A causal trace of two tokens, one head of d_k 2, shaped as /trace answers (the numbers chosen by hand). */
function tinyTrace() {
  const q = [[[1, 2], [3, -1]]];
  const k = [[[0.5, 0.25], [-1, 2]]];
  const v = [[[1, 0], [0, 1]]];
  const scores = [[[1, 3], [1.25, -5]]];
  const s = Math.SQRT2;
  const scaled = scores.map((hm) => hm.map((r) => r.map((x) => x / s)));
  const w1 = [Math.exp(1.25 / s - 1.25 / s), Math.exp(-5 / s - 1.25 / s)];
  const weights = [[[1, 0], w1.map((e) => e / (w1[0] + w1[1]))]];
  return {
    schema_version: '1.2.0', engine_version: '1.0.0', parameters_digest: 'sha256:x',
    config: { d_model: 2, num_heads: 1, d_k: 2, seed: 0, scale: true, causal: true, positional_encoding: 'none',
      scale_factor: s },
    tokens: [{ index: 0, text: 'the' }, { index: 1, text: "didn't" }],
    stages: {
      q: { values: q }, k: { values: k }, v: { values: v }, scores: { values: scores },
      scaled_scores: { values: scaled }, masked_scores: { values: [[[scaled[0][0][0], null], scaled[0][1]]] },
      weights: { values: weights },
      context: { values: [[[1, 0], [weights[0][1][0], weights[0][1][1]]]] },
    },
  };
}

test('explainCell: the eight steps of /explain, the stages\' numbers read from the trace', () => {
  const doc = tinyTrace();
  const x = C.explainCell(doc, 0, 1, 0);
  assert.deepEqual(x.steps.map((s) => s.id), ['products', 'score', 'scaled', 'row_max', 'exp', 'denominator', 'weight',
    'contributions']);
  const step = Object.fromEntries(x.steps.map((s) => [s.id, s]));
  assert.deepEqual(step.products.values, [1.5, -0.25]);
  assert.equal(step.products.formula, "q_didn't[m] · k_the[m] for m = 0 … 1");
  assert.equal(step.score.value, 1.25);
  assert.equal(step.score.recomputed, 1.25);
  assert.equal(step.score.exact, true);
  assert.equal(step.scaled.value, doc.stages.scaled_scores.values[0][1][0]);
  assert.equal(step.scaled.note, `divided by the trace's scale factor √d_k = √2 = ${Math.SQRT2}`);
  assert.equal(step.row_max.value, 1.25 / Math.SQRT2);
  assert.equal(step.row_max.formula, 'max over the unmasked keys of row 1 ("didn\'t") of the scaled scores');
  assert.equal(step.exp.value, 1);
  assert.equal(step.weight.value, doc.stages.weights.values[0][1][0]);
  assert.equal(step.weight.note, "the share of key 'the' in the attention of query \"didn't\"; the row's weights sum to 1");
  assert.deepEqual(step.contributions.vector, doc.stages.context.values[0][1]);
  assert.equal(x.masked, false);
  assert.deepEqual(x.masked_keys, []);
  assert.equal(x.kv_head, 0);
  assert.equal(x.key_source, 'tokens');
  assert.equal(x.decode, undefined, 'no decoding step without decode');
});

test('explainCell: a masked cell keeps its score, has exp and weight 0, and says why', () => {
  const x = C.explainCell(tinyTrace(), 0, 0, 1);
  const step = Object.fromEntries(x.steps.map((s) => [s.id, s]));
  assert.equal(x.masked, true);
  assert.equal(x.mask_reason, "causal mask: key 1 \"didn't\" comes after query 0 'the' (key > query), and a token may "
    + 'not attend to later tokens');
  assert.deepEqual(x.masked_keys, [1]);
  assert.equal(step.score.value, 3);
  assert.equal(step.exp.value, 0);
  assert.equal(step.exp.exponent, null);
  assert.deepEqual(step.denominator.values, [1, 0]);
  assert.equal(step.weight.value, 0);
  assert.deepEqual(step.contributions.values, [[1, 0], null]);
  assert.ok(step.row_max.note.endsWith('; masked keys [1] do not count'));
  assert.ok(step.weight.note.startsWith('masked (causal mask: key 1'));
});

test('maskReason and decodeCell say what the engine says', () => {
  assert.equal(C.maskReason({ window: 2 }, 3, 0, 'on', 'the'), "sliding window of 2: key 0 'the' is 3 positions before "
    + "query 3 'on', and a query sees only its own key and the 1 before it (query − key ≥ window)");
  const steps = [null, null, { cache_positions: [1, 2], scores: [[0.5, 0.25]], scaled_scores: [[0.1, 0.2]], weights: [[0.3, 0.7]] }];
  const inCache = C.decodeCell(steps, 0, 2, 2, { score: 0.25, weight: 0.7 });
  assert.deepEqual(inCache, { position: 2, cache_positions: [1, 2], in_cache: true, cache_index: 1, score: 0.25, scaled: 0.2,
    weight: 0.7, score_difference: 0, weight_difference: 0, note: 'step 2 scores its new query against the 2 cached keys; '
      + 'key 2 is entry 1 of the cache' });
  assert.equal(C.decodeCell(steps, 0, 2, 0, { score: 0, weight: 0 }).note,
    "key 0 has left the sliding window's cache at step 2: the cache holds positions 1 … 2, so no mask is needed");
});
