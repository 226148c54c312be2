/* heads.js and url-state.js's head fields: constructed heads in the request, the address, the presets, the captions. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { load } = require('./load.js');

const AT = load('format.js', 'trace.js', 'fields.js', 'url-state.js', 'heads.js');
const U = AT.urlState;
const H = AT.heads;
const fields = (extra = {}) => ({ ...U.DEFAULT_FIELDS, ...extra });

test('every head seeded sends neither field: the plain request is unchanged', () => {
  const plain = U.requestFrom(fields({ sharpness: '3' })).body;
  assert.ok(!('head_weights' in plain) && !('sharpness' in plain));
  assert.equal(U.kindsText(['seeded', 'seeded']), '', 'an all-seeded choice is no choice');
  assert.equal(U.hashFor(fields({ sharpness: '3' }), { query: 1, head: 0, step: null }),
    '#sentence=the+cat+sat&d_model=24&num_heads=1&seed=0&scale=1&causal=0&q=1&head=0');
});

test('constructed heads are sent with the sharpness, last, and a sharpness JSON cannot carry is an error', () => {
  const { body, errors } = U.requestFrom(fields({ d_model: '64', num_heads: '2', head_weights: 'previous_token,seeded',
    sharpness: ' 2.5 ' }));
  assert.deepEqual(errors, {});
  assert.deepEqual(body.head_weights, ['previous_token', 'seeded']);
  assert.equal(body.sharpness, 2.5);
  assert.deepEqual(Object.keys(body).slice(-2), ['head_weights', 'sharpness']);
  assert.equal(U.requestFrom(fields({ head_weights: 'first_token', sharpness: '' })).body.sharpness, 10);
  const bad = U.requestFrom(fields({ head_weights: 'first_token', sharpness: 'sharp' }));
  assert.equal(bad.body.sharpness, null);
  assert.deepEqual(Object.keys(bad.errors), ['/sharpness']);
});

test('head_weights and sharpness round-trip through the address', () => {
  const f = fields({ sentence: 'the cat sat on the mat', d_model: '96', num_heads: '3', causal: true,
    head_weights: 'previous_token,same_token,seeded', sharpness: '25' });
  const hash = U.hashFor(f, { query: 4, head: 1, step: null });
  assert.match(hash, /&hw=previous_token%2Csame_token%2Cseeded&sharpness=25&q=4&head=1$/);
  const back = U.fieldsFromHash(hash);
  assert.deepEqual(back, f);
  assert.deepEqual(U.requestFrom(back).body, U.requestFrom(f).body);
  // The default sharpness stays out of the address, and comes back as the default.
  const plainSharp = U.hashFor({ ...f, sharpness: '10' }, { query: 0, head: 0, step: null });
  assert.ok(!plainSharp.includes('sharpness'));
  assert.equal(U.fieldsFromHash(plainSharp).sharpness, '10');
});

test('an address with an unknown kind or an odd sharpness falls back to the defaults', () => {
  assert.equal(U.fieldsFromHash('#hw=previous_token,bogus').head_weights, '');
  assert.equal(U.fieldsFromHash('#hw=seeded,seeded').head_weights, '', 'all seeded: nothing to send');
  assert.equal(U.fieldsFromHash('#hw=first_token&sharpness=<b>').sharpness, '10');
  assert.equal(U.fieldsFromHash('#hw=first_token&sharpness=1e2').sharpness, '1e2');
});

test('one kind a head: padded with seeded heads, cut to the head count', () => {
  assert.deepEqual(U.headKinds('', 2), ['seeded', 'seeded']);
  assert.deepEqual(U.headKinds('previous_token', 3), ['previous_token', 'seeded', 'seeded']);
  assert.deepEqual(U.headKinds('previous_token,same_token,first_token', 2), ['previous_token', 'same_token']);
});

test('a saved trace with constructed heads shows them in its fields', () => {
  const doc = { config: { d_model: 64, num_heads: 2, seed: 0, scale: true, causal: true, positional_encoding: 'sinusoidal',
    head_weights: ['same_token', 'seeded'], sharpness: 4 }, tokens: [{ text: 'a' }] };
  const shown = U.fieldsFromTrace({ sentence: 'a' }, doc);
  assert.equal(shown.head_weights, 'same_token,seeded');
  assert.equal(shown.sharpness, '4');
});

test('the service\'s messages about heads read in the page\'s words, at the head they name', () => {
  const msg = 'head_weights[1] (same_token) needs d_k ≥ 28, and d_k = d_model / num_heads = 16: use fewer heads or a larger d_model';
  const words = U.uiWords(msg);
  assert.equal(words, 'head 1 (same-token) needs d_k ≥ 28, and d_k = d_model / h = 16: use fewer heads or a larger d_model');
  const known = ['/head_weights', '/sharpness', '/d_model'];
  assert.deepEqual(U.fieldError('/head_weights/1', words, known), { field: '/head_weights', text: words });
  assert.deepEqual(U.fieldError('/head_weights/0', 'must be one of …', known),
    { field: '/head_weights', text: 'head 0: must be one of …' });
  assert.equal(U.uiWords('sharpness must be a number above 0 and at most 1000, got 0'),
    'Sharpness must be a number above 0 and at most 1000, got 0');
  assert.equal(U.uiWords('constructed heads have their own W_K and W_V, so K/V heads cannot be shared: drop num_kv_heads'),
    'constructed heads have their own W_K and W_V, so K/V heads cannot be shared: clear K/V heads');
});

test('the presets: one per job, each within its kind\'s limits, each a preset again after a round trip', () => {
  assert.deepEqual(H.PRESETS.map((p) => p.id), ['previous_token', 'same_token', 'first_token', 'induction', 'mixed']);
  const MIN_DK = { previous_token: 16, same_token: 28, first_token: 8, induction: 20, seeded: 0 };
  for (const p of H.PRESETS) {
    const { body, errors } = U.requestFrom(p.fields);
    assert.deepEqual(errors, {}, p.id);
    const dk = body.d_model / body.num_heads;
    assert.ok(Number.isInteger(dk), p.id);
    assert.equal(body.head_weights.length, body.num_heads, p.id);
    for (const kind of body.head_weights) assert.ok(dk >= MIN_DK[kind], `${p.id}: ${kind} at d_k ${dk}`);
    assert.ok(body.d_model >= (body.head_weights.includes('induction') ? 43 : 30), p.id);
    assert.equal(body.causal, true, p.id);
    assert.ok(!body.head_weights.includes('induction') || (body.num_layers >= 2 && body.block), p.id);
    assert.ok(p.caption.length > 80 && p.label, p.id);
    assert.ok(p.select.query < body.sentence.split(' ').length, p.id);
    // The address carries it: a reload makes the same request, so the same caption.
    const back = U.requestFrom(U.fieldsFromHash(U.hashFor(p.fields, { query: 0, head: 0, step: null }))).body;
    assert.deepEqual(back, body, p.id);
    assert.equal(H.presetOf(back)?.id, p.id);
    assert.equal(H.captionFor(back, null).lines[0], p.caption);
  }
  const ind = H.PRESETS.find((p) => p.id === 'induction');
  const words = ind.fields.sentence.split(' ');
  assert.equal(words[ind.select.query], words[0], 'the query is the repeated A');
  assert.match(ind.caption, new RegExp(`"${words[1]}"`), 'the caption names the B the output copies');
});

test('a configuration of the user\'s gets a line a constructed head; all seeded, no caption', () => {
  const body = { sentence: 'a b a', d_model: 96, num_heads: 3, head_weights: ['seeded', 'first_token', 'previous_token'] };
  const c = H.captionFor(body, { head_weights: body.head_weights });
  assert.equal(c.preset, null);
  assert.deepEqual(c.lines, [`head 1 · first-token: ${H.KIND_CAPTIONS.first_token}`,
    `head 2 · previous-token: ${H.KIND_CAPTIONS.previous_token}`]);
  assert.equal(H.captionFor({ sentence: 'a' }, { d_model: 8 }), null);
  assert.equal(H.captionFor({ ...body, head_weights: ['seeded', 'seeded', 'seeded'] }, null), null);
  // A preset's request with one field changed is no longer the preset.
  const p = H.presetBody(H.PRESETS[0]);
  assert.equal(H.presetOf({ ...p, sentence: 'the dog sat' }), null);
  assert.equal(H.presetOf({ ...p })?.id, 'previous_token');
});

test('a head\'s name says its job', () => {
  assert.equal(H.headName({ head_weights: ['previous_token', 'seeded'] }, 0), 'head 0 · previous-token');
  assert.equal(H.headName({ head_weights: ['previous_token', 'seeded'] }, 1), 'head 1');
  assert.equal(H.headName({}, 2), 'head 2');
});

test('a request that names fewer fields but makes a preset\'s trace is that preset, given its config', () => {
  const ind = H.PRESETS.find((p) => p.id === 'induction');
  // What `attention-trace … --block gpt2 --layers 2 --head-weights induction --d-model 128 --html` sends.
  const cli = { sentence: ind.fields.sentence, d_model: 128, block: 'gpt2', num_layers: 2, head_weights: ['induction'] };
  const cfg = { d_model: 128, num_heads: 1, seed: 0, scale: true, causal: true, positional_encoding: 'sinusoidal',
    num_layers: 2, block: 'gpt2', head_weights: ['induction'], sharpness: 10.0 };
  assert.equal(H.presetOf(cli), null, 'without the config: not the same request');
  assert.equal(H.presetOf(cli, cfg)?.id, 'induction');
  assert.equal(H.captionFor(cli, cfg).lines[0], ind.caption);
  assert.equal(H.presetOf(cli, { ...cfg, seed: 1 }), null, 'another seed is another trace');
  assert.equal(H.presetOf({ ...cli, window: 3 }, cfg), null, 'a field the preset does not send');
  assert.equal(H.presetOf({ ...cli, sentence: 'harry potter' }, cfg), null);
});
