/* trace.js: reading a /trace answer. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { load } = require('./load.js');

const T = load('format.js', 'trace.js').trace;

const tokens = (...words) => words.map((text, index) => ({ index, text }));
const cfg = (extra = {}) => ({ d_model: 24, num_heads: 4, seed: 0, scale: true, causal: false,
  positional_encoding: 'sinusoidal', ...extra });

test('the key axis is the context\'s in cross-attention, else the sentence\'s', () => {
  const self = { tokens: tokens('the', 'cat') };
  const cross = { tokens: tokens('the', 'cat'), context_tokens: tokens('le', 'chat', 'assis') };
  assert.equal(T.keyTokensOf(self), self.tokens);
  assert.equal(T.keyTokensOf(cross), cross.context_tokens);
  assert.equal(T.isCross(self), false);
  assert.equal(T.isCross(cross), true);
});

test('kvHeadOf: the K/V head a query head reads', () => {
  const gqa = { query_heads_of_kv_head: [[0, 1], [2, 3]] };
  assert.deepEqual([0, 1, 2, 3].map((hd) => T.kvHeadOf(gqa, hd)), [0, 0, 1, 1]);
  assert.deepEqual([0, 1, 2].map((hd) => T.kvHeadOf({ query_heads_of_kv_head: [[0, 1, 2]] }, hd)), [0, 0, 0]);
  assert.equal(T.kvHeadOf({}, 3), 3, 'without GQA every head reads its own');
  assert.equal(T.kvHeadOf(gqa, 9), 0, 'a head no group lists falls back to K/V head 0');
});

test('exportName: sentence, sizes, seed and every variant in the name', () => {
  const doc = (c, extra = {}) => ({ config: cfg(c), tokens: tokens('the', 'cat', 'sat'), ...extra });
  assert.equal(T.exportName(doc({}), { sentence: 'the cat sat' }), 'attention-trace_the-cat-sat_d24_h4_seed0');
  assert.equal(T.exportName(doc({ scale: false, causal: true }), { sentence: 'The Cat, sat!' }),
    'attention-trace_the-cat-sat_d24_h4_seed0_unscaled_causal');
  assert.equal(T.exportName(doc({ positional_encoding: 'rope', num_kv_heads: 2, window: 3, causal: true, decode: true,
    seed: 7 }), { sentence: 'the cat sat' }), 'attention-trace_the-cat-sat_d24_h4_seed7_causal_rope_kv2_w3_decode');
  assert.equal(T.exportName(doc({}, { context_tokens: tokens('le', 'chat') }), { sentence: 'the cat sat' }),
    'attention-trace_the-cat-sat_d24_h4_seed0_cross');
});

test('exportName: a slug of at most 40 characters, from the tokens when the request had none', () => {
  const doc = { config: cfg(), tokens: tokens('</script>', 'x') };
  assert.equal(T.exportName(doc, { tokens: ['</script>', 'x'] }), 'attention-trace_script-x_d24_h4_seed0');
  const long = 'a'.repeat(30) + ' ' + 'b'.repeat(30);
  assert.equal(T.exportName(doc, { sentence: long }), `attention-trace_${'a'.repeat(30)}-${'b'.repeat(9)}_d24_h4_seed0`);
  assert.equal(T.exportName(doc, { sentence: 'été' }), 'attention-trace_t_d24_h4_seed0');
  assert.equal(T.exportName(doc, { sentence: '“…”' }), 'attention-trace_trace_d24_h4_seed0');
});

test('the drawing limits', () => {
  assert.equal(T.HEATMAP_MAX_TOKENS, 48);
  assert.equal(T.CELL_NUMBERS_MAX_TOKENS, 12);
});

test('presentSlides: one stage at a time, in the lecture\'s order; a stage the trace lacks has no slide', () => {
  const doc = (config, extra = {}) => ({ config: { num_heads: 1, scale: true, positional_encoding: 'sinusoidal', ...config },
    stages: { scores: {}, weights: {}, ...(extra.masked ? { masked_scores: {} } : {}) }, ...extra.doc });
  const ids = (d) => T.presentSlides(d).map((s) => s.id);
  assert.deepEqual(ids(doc({})), ['input', 'project', 'scores', 'scaled_scores', 'weights', 'context', 'concat']);
  assert.deepEqual(ids(doc({ causal: true }, { masked: true, doc: { decode: [] } })),
    ['input', 'project', 'scores', 'scaled_scores', 'masked_scores', 'weights', 'context', 'concat', 'decode']);
  const slides = T.presentSlides(doc({ positional_encoding: 'rope', num_kv_heads: 1, num_heads: 4, window: 2 }, { masked: true }));
  const byId = Object.fromEntries(slides.map((s) => [s.id, s]));
  assert.equal(byId.scores.title, 'Score: RoPE(Q)·RoPE(K)ᵀ');
  assert.deepEqual(byId.project.rows, ['project', 'rotate']);
  assert.deepEqual(byId.project.parts, ['matrices', 'kv']);
  assert.equal(byId.masked_scores.title, 'Mask (sliding window)');
  assert.deepEqual(byId.weights.parts, ['map:weights', 'heads', 'explain']);
  assert.equal(byId.concat.title, 'Concatenate the heads, then W_O');
  assert.equal(T.presentSlides(doc({ scale: false }))[3].title, 'Scale (off: divide by 1)');
  for (const s of slides) assert.ok(s.title && Array.isArray(s.rows) && Array.isArray(s.parts), s.id);
});
