/* url-state.js: the inputs as data: the request, the d_k card's counts, the address both ways. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const { load } = require('./load.js');

const U = load('format.js', 'fields.js', 'url-state.js').urlState;
const fields = (extra = {}) => ({ ...U.DEFAULT_FIELDS, ...extra });

test('the default fields are the plain request, in the order it is sent', () => {
  const { body, errors } = U.requestFrom(U.DEFAULT_FIELDS);
  assert.deepEqual(errors, {});
  // The key order is part of what is sent (the curl command, and the saved page's embedded request).
  assert.equal(JSON.stringify(body), '{"sentence":"the cat sat","d_model":24,"num_heads":1,"seed":0,"scale":true,'
    + '"causal":false,"positional_encoding":"sinusoidal"}');
});

test('whole numbers as typed; what JSON cannot carry is an error on its field, sent as null', () => {
  assert.equal(U.readInt(' 24 '), 24);
  assert.equal(U.readInt('0'), 0);
  for (const bad of ['', 'abc', '-1', '1e3', '2.0', '9007199254740993', '٣']) assert.equal(U.readInt(bad), null, bad);
  const { body, errors } = U.requestFrom(fields({ d_model: '2 4', seed: '-1' }));
  assert.equal(body.d_model, null);
  assert.equal(body.seed, null);
  assert.deepEqual(Object.keys(errors), ['/d_model', '/seed']);
  assert.equal(errors['/d_model'], 'enter a whole number, 1 or more');
  // The slider's value is a number; num_heads itself is the service's to judge (5 heads at d_model 24 is sent).
  assert.equal(U.requestFrom(fields({ num_heads: '5' })).body.num_heads, 5);
});

test('the variants are sent only when used', () => {
  const plain = U.requestFrom(fields({ rope_base: '500000', rope_pairing: 'interleaved' })).body;
  assert.ok(!('rope_base' in plain) && !('rope_pairing' in plain), 'RoPE fields without RoPE');
  const rope = U.requestFrom(fields({ positional_encoding: 'rope', rope_base: ' 500000 ', rope_pairing: 'interleaved' })).body;
  assert.equal(rope.rope_base, 500000);
  assert.equal(rope.rope_pairing, 'interleaved');
  assert.equal(U.requestFrom(fields({ positional_encoding: 'rope', rope_base: '' })).body.rope_base, 10000);
  const badBase = U.requestFrom(fields({ positional_encoding: 'rope', rope_base: 'ten' }));
  assert.equal(badBase.body.rope_base, null);
  assert.deepEqual(Object.keys(badBase.errors), ['/rope_base']);

  const all = U.requestFrom(fields({ num_kv_heads: '2', window: ' 3', context_sentence: 'le chat',
    context_tokens: 'le\nchat\n\n', decode: true, causal: true })).body;
  assert.equal(JSON.stringify(all), '{"sentence":"the cat sat","d_model":24,"num_heads":1,"seed":0,"scale":true,'
    + '"causal":true,"positional_encoding":"sinusoidal","num_kv_heads":2,"window":3,"context_sentence":"le chat",'
    + '"context_tokens":["le","chat"],"decode":true}');
  const bad = U.requestFrom(fields({ num_kv_heads: 'two', window: '-3' }));
  assert.deepEqual(Object.keys(bad.errors), ['/num_kv_heads', '/window']);
  assert.equal(bad.body.num_kv_heads, null);
  assert.deepEqual(U.splitLines('a\n\nb\n'), ['a', '', 'b'], 'an empty line inside is an empty token');
  assert.deepEqual(U.splitLines(' sub\n##word'), [' sub', '##word'], 'tokens are used as given');
});

test('the comparison request flips scale and drops decoding, leaving the request alone', () => {
  const body = U.requestFrom(fields({ decode: true, causal: true })).body;
  const alt = U.comparisonBody(body);
  assert.equal(alt.scale, false);
  assert.ok(!('decode' in alt));
  assert.equal(body.decode, true);
  assert.deepEqual(Object.keys(alt), Object.keys(body).filter((k) => k !== 'decode'), 'same key order');
  // A request without scale is scaled (the service's default): its comparison is not. (A saved page's request is
  // the one it was made with, which may leave scale out.)
  assert.equal(JSON.stringify(U.comparisonBody({ sentence: 'x', decode: true })), '{"sentence":"x","scale":false}');
});

test('the d_k card from the fields as typed', () => {
  assert.deepEqual(U.divisors(24, 64), [1, 2, 3, 4, 6, 8, 12, 24]);
  assert.equal(U.divisors(128, 64).at(-1), 64);
  assert.deepEqual(U.divisors(7, 64), [1, 7]);

  const four = U.dkCard(fields({ num_heads: '4' }), 64);
  assert.deepEqual(four.shown, { dModel: '24', heads: '4', dk: '6', matrices: '13', params: '2,304', scale: '2.4495' });
  assert.equal(four.whole, true);
  // 5 heads do not divide 24: d_k is a fraction, and no divisor follows from it.
  const five = U.dkCard(fields({ num_heads: '5' }), 64);
  assert.deepEqual(five.shown, { dModel: '24', heads: '5', dk: '4.8', matrices: '16', params: '2,304', scale: '—' });
  assert.equal(U.dkCard(fields({ num_heads: '7' }), 64).shown.dk, '3.429');
  // Grouped-query attention: W_K and W_V shrink to kv·d_k rows.
  const gqa = U.dkCard(fields({ num_heads: '4', num_kv_heads: '2' }), 64);
  assert.deepEqual([gqa.shown.matrices, gqa.shown.params], ['9', '1,728']);
  const bad = U.dkCard(fields({ num_heads: '4', num_kv_heads: '3' }), 64);
  assert.deepEqual([bad.shown.matrices, bad.shown.params], ['—', '—']);
  assert.equal(U.dkCard(fields({ scale: false }), 64).shown.scale, '1.0000');
  const none = U.dkCard(fields({ d_model: 'x' }), 64);
  assert.deepEqual(none.shown, { dModel: '?', heads: '1', dk: '?', matrices: '4', params: '—', scale: '—' });
  assert.equal(none.sliderMax, null);
  assert.equal(U.dkCard(fields({ d_model: '512' }), 64).sliderMax, 64);
  assert.equal(U.dkCard(fields({ d_model: '1' }), 64).sliderMax, 2);
  assert.equal(U.dkCard(fields({ d_model: '8', num_heads: '12' }), 64).sliderMax, 12, 'never below the current value');
});

test('a service message goes to its field, an item\'s to its list', () => {
  const known = ['/sentence', '/tokens', '/window', '/rope_base', '/context_tokens'];
  assert.deepEqual(U.fieldError('/window', 'needs causal', known), { field: '/window', text: 'needs causal' });
  assert.deepEqual(U.fieldError('/context_tokens/1', 'empty', known),
    { field: '/context_tokens', text: 'line 2 (token 1): empty' });
  assert.deepEqual(U.fieldError('/rope_base/x', 'm', known), { field: '/rope_base', text: 'x: m' });
  assert.equal(U.fieldError('/nope', 'm', known), null);
  assert.equal(U.fieldError('', 'm', known), null);
});

test('the request as curl: quoted for the shell, to this service or to $ATTENTION_TRACE_URL', () => {
  const body = { sentence: "it's $HOME `x` \"q\"\nnext", d_model: 24 };
  const live = U.curlFor(body, { href: 'http://127.0.0.1:8000/sub/?x=1#q=2' });
  assert.ok(live.startsWith("curl -s 'http://127.0.0.1:8000/sub/trace' -H 'content-type: application/json' -d '"), live);
  const saved = U.curlFor(body, { saved: true });
  assert.ok(saved.startsWith(`curl -s "$ATTENTION_TRACE_URL/trace" -H`), saved);
  // The shell hands curl the JSON exactly.
  const words = execFileSync('/bin/sh', ['-c', `for w in ${live.slice('curl '.length)}; do printf '%s\\0' "$w"; done`],
    { encoding: 'utf8' }).split('\0').slice(0, -1);
  assert.deepEqual(words.slice(0, 2), ['-s', 'http://127.0.0.1:8000/sub/trace']);
  assert.deepEqual(JSON.parse(words.at(-1)), body);
});

test('the address: the defaults, and the example in docs/viewer.md', () => {
  assert.equal(U.hashFor(U.DEFAULT_FIELDS, { query: 1, head: 0, step: null }),
    '#sentence=the+cat+sat&d_model=24&num_heads=1&seed=0&scale=1&causal=0&q=1&head=0');
  assert.deepEqual(U.fieldsFromHash(''), U.DEFAULT_FIELDS);
  assert.deepEqual(U.fieldsFromHash('#'), U.DEFAULT_FIELDS);
  assert.deepEqual(U.selectionFromHash(''), { step: null, query: 1, head: 0, colour: 'auto', present: false, slide: null, layer: null, bstage: null });
  const hash = '#sentence=the+cat+sat&d_model=24&num_heads=4&q=1&head=2&causal=1';
  assert.deepEqual(U.fieldsFromHash(hash), fields({ num_heads: '4', causal: true }));
  assert.deepEqual(U.fieldsFromHash(hash.slice(1)), U.fieldsFromHash(hash), 'with or without the #');
  assert.deepEqual(U.selectionFromHash(hash), { step: null, query: 1, head: 2, colour: 'auto', present: false, slide: null, layer: null, bstage: null });
  const variants = '#sentence=the+cat+sat+on+the+mat&d_model=24&num_heads=4&kv=2&causal=1&window=3&decode=1&step=4';
  assert.deepEqual(U.fieldsFromHash(variants), fields({ sentence: 'the cat sat on the mat', num_heads: '4',
    num_kv_heads: '2', causal: true, window: '3', decode: true }));
  assert.deepEqual(U.selectionFromHash(variants), { step: 4, query: 1, head: 0, colour: 'auto', present: false, slide: null, layer: null, bstage: null });
});

test('the address round trip: every field and the selection come back as they were', () => {
  const cases = [
    fields(),
    fields({ sentence: 'a+b & c=d #e %f ?g', d_model: '48', num_heads: '6', seed: '4294967295', scale: false }),
    fields({ positional_encoding: 'rope', rope_base: '500000', rope_pairing: 'interleaved', num_heads: '4' }),
    fields({ positional_encoding: 'rope', rope_base: '1e4' }),
    fields({ positional_encoding: 'none', num_kv_heads: '2', window: '3', causal: true, decode: true }),
    fields({ context_sentence: 'le chat était assis' }),
    fields({ context_tokens: 'le\nchat\n\n##ait\n“</script>”' }),
    fields({ block: 'gpt2', num_layers: '3', causal: true }),
    fields({ block: 'llama', num_layers: '12', positional_encoding: 'rope', causal: true, num_kv_heads: '1' }),
    fields({ block: 'vaswani2017' }),
    fields({ num_layers: '2' }),
  ];
  const selections = [{ query: 0, head: 0, step: null, colour: 'auto', present: false, slide: null, layer: null, bstage: null }, { query: 5, head: 3, step: 2, colour: 'auto', present: false, slide: null, layer: null, bstage: null },
    { query: 2, head: 1, step: null, colour: 'row', present: true, slide: 'masked_scores', layer: null, bstage: null },
    { query: 2, head: 1, step: 3, colour: 'map', present: true, slide: null, layer: 2, bstage: 'ffn' }];
  for (const f of cases) {
    for (const sel of selections) {
      const hash = U.hashFor(f, sel);
      assert.match(hash, /^#[A-Za-z0-9_.~*+%=&-]*$/, 'one URL fragment, percent-encoded');
      assert.deepEqual(U.fieldsFromHash(hash), f, hash);
      assert.deepEqual(U.selectionFromHash(hash), sel, hash);
    }
  }
});

test('the address leaves out what a request does not use', () => {
  // RoPE's base and pairing only with RoPE, and then only when not the defaults; variants only when set.
  const hash = U.hashFor(fields({ rope_base: '500000', rope_pairing: 'interleaved' }), { query: 1, head: 0, step: null });
  assert.ok(!/rope|pe=|kv=|window=|context=|ctok=|decode=|step=/.test(hash), hash);
  const rope = U.hashFor(fields({ positional_encoding: 'rope' }), { query: 1, head: 0, step: null });
  assert.ok(rope.includes('&pe=rope&') && !rope.includes('rope_base') && !rope.includes('rope_pairing'), rope);
  // A saved page's inputs are fixed: the selection only.
  assert.equal(U.hashFor(null, { query: 2, head: 3, step: 2 }), '#step=2&q=2&head=3');
  assert.equal(U.hashFor(null, { query: 0, head: 0, step: null }), '#q=0&head=0');
});

test('the address rejects what it cannot hold: each such value falls back to its default', () => {
  const f = U.fieldsFromHash('#d_model=abc&num_heads=-1&seed=1e3&pe=alibi&rope_base=1;alert(1)&rope_pairing=weird'
    + '&kv=x&window=-2&causal=yes&decode=true&scale=no');
  assert.deepEqual(f, fields({ scale: true }));
  assert.equal(U.fieldsFromHash('#scale=0').scale, false, 'only scale=0 turns scaling off');
  assert.equal(U.fieldsFromHash('#d_model=12345678901').d_model, '24', 'more than 10 digits');
  assert.equal(U.fieldsFromHash('#d_model=1234567890').d_model, '1234567890', 'the service judges the size');
  assert.equal(U.fieldsFromHash(`#rope_base=${'9'.repeat(25)}`).rope_base, '10000', 'more than 24 characters');
  assert.equal(U.fieldsFromHash('#rope_base=5e5').rope_base, '5e5');
  assert.equal(U.fieldsFromHash('#kv=%20%202').num_kv_heads, '', 'spaces are not digits');
  assert.deepEqual(U.selectionFromHash('#q=-1&head=1.5&step=abc'), { step: null, query: 1, head: 0, colour: 'auto', present: false, slide: null, layer: null, bstage: null });
  assert.deepEqual(U.selectionFromHash('#q=2&head=3&step=-1'), { step: null, query: 2, head: 3, colour: 'auto', present: false, slide: null, layer: null, bstage: null });
  assert.deepEqual(U.selectionFromHash('#q=1e1&head=0x2&step=4.0'), { step: 4, query: 10, head: 2, colour: 'auto', present: false, slide: null, layer: null, bstage: null });
  assert.deepEqual(U.selectionFromHash('#colour=rainbow&present=yes&slide=</script>'), { step: null, query: 1, head: 0, colour: 'auto', present: false, slide: null, layer: null, bstage: null });
  assert.equal(U.selectionFromHash('#present=1&slide=' + 'a'.repeat(33)).slide, null, 'at most 32 letters');
});

test('a saved trace shows the fields it was made with', () => {
  const doc = { config: { d_model: 24, num_heads: 4, seed: 3, scale: false, causal: true, positional_encoding: 'rope',
    rope_base: 500000, rope_pairing: 'interleaved', num_kv_heads: 2, window: 3, decode: true },
  tokens: [{ text: 'the' }, { text: 'cat' }] };
  assert.deepEqual(U.fieldsFromTrace({ tokens: ['the', 'cat'] }, doc), {
    ...U.DEFAULT_FIELDS, sentence: 'the cat', d_model: '24', num_heads: '4', seed: '3', scale: false, causal: true,
    positional_encoding: 'rope', rope_base: '500000', rope_pairing: 'interleaved', num_kv_heads: '2', window: '3',
    context_sentence: '', context_tokens: '', decode: true, block: '', num_layers: '1', head_weights: '', sharpness: '10',
    lm_head: '',
  });
  const plain = { config: { d_model: 8, num_heads: 2, seed: 0, scale: true, causal: false, positional_encoding: 'sinusoidal' },
    tokens: [{ text: 'x' }] };
  const shown = U.fieldsFromTrace({ sentence: ' x ', context_tokens: ['le', 'chat'] }, plain);
  assert.equal(shown.sentence, ' x ', 'the request\'s own text');
  assert.equal(shown.context_tokens, 'le\nchat');
  assert.equal(shown.rope_base, '10000');
  assert.equal(U.requestFrom(shown).body.context_tokens.join('|'), 'le|chat', 'the fields describe the same request');
});

test('the view\'s own settings join the address only when not the defaults', () => {
  const base = { query: 1, head: 0, step: null };
  assert.equal(U.hashFor(null, { ...base, colour: 'auto', present: false, slide: null, layer: null, bstage: null }), '#q=1&head=0');
  assert.equal(U.hashFor(null, { ...base, colour: 'row', present: false, slide: 'weights' }), '#q=1&head=0&colour=row',
    'a slide only in present mode');
  assert.equal(U.hashFor(null, { ...base, colour: 'map', present: true, slide: 'weights' }),
    '#q=1&head=0&colour=map&present=1&slide=weights');
  assert.equal(U.hashFor(null, { ...base, present: true, slide: null }), '#q=1&head=0&present=1');
});

test('a busy slide\'s figure: part, 1-based in the address, only past the first; an address without it, the first', () => {
  const base = { query: 1, head: 0, step: null, colour: 'auto', present: true, slide: 'scores' };
  assert.equal(U.hashFor(null, { ...base, part: 0 }), '#q=1&head=0&present=1&slide=scores');
  assert.equal(U.hashFor(null, { ...base, part: null }), '#q=1&head=0&present=1&slide=scores');
  assert.equal(U.hashFor(null, { ...base, part: 2 }), '#q=1&head=0&present=1&slide=scores&part=3');
  assert.equal(U.hashFor(null, { ...base, part: -1 }), '#q=1&head=0&present=1&slide=scores', 'the last: not known yet');
  assert.equal(U.hashFor(null, { ...base, present: false, part: 2 }), '#q=1&head=0', 'only in present mode');
  assert.equal(U.selectionFromHash('#present=1&slide=scores&part=3').part, 2);
  assert.equal('part' in U.selectionFromHash('#present=1&slide=scores'), false, 'an old address: the first figure');
  for (const bad of ['0', '-1', 'x', '1.5', '100']) assert.equal('part' in U.selectionFromHash(`#present=1&part=${bad}`), false, bad);
  assert.equal(U.selectionFromHash('#present=1&slide=next-token').slide, 'next-token', 'the head\'s slide by its id');
});

test('uiWords: the service\'s field names in the page\'s words, the rest of the message as sent', () => {
  // engine/checks.py's messages, as the page shows them next to the controls.
  assert.equal(U.uiWords('a sliding window limits how far back a query looks under the causal mask, so it needs causal: true; '
    + 'set causal: true or drop window'), 'a sliding window limits how far back a query looks under the causal mask, so it '
    + 'needs the causal mask; switch the causal mask on or clear Sliding window');
  assert.equal(U.uiWords('… every query sees the whole context (as in the Transformer decoder\'s cross-attention); '
    + 'set causal: false and drop window'), '… every query sees the whole context (as in the Transformer decoder\'s '
    + 'cross-attention); switch the causal mask off and clear Sliding window');
  assert.equal(U.uiWords('KV-cache decoding generates one token at a time, so each query sees only the tokens before it: '
    + 'it needs causal: true'), 'KV-cache decoding generates one token at a time, so each query sees only the tokens '
    + 'before it: it needs the causal mask');
  assert.equal(U.uiWords('d_model 24 is not divisible by num_heads 5 (d_k would be 4.8); choose num_heads among the '
    + 'divisors of d_model: 1, 2, 3, 4, 6, 8, 12, 24'), 'd_model 24 is not divisible by h = 5 (d_k would be 4.8); choose '
    + 'h among the divisors of d_model: 1, 2, 3, 4, 6, 8, 12, 24');
  assert.equal(U.uiWords('… = 24 / 8 = 3; choose num_heads among 1, 2, 3 (d_k even), or use positional_encoding "sinusoidal"'),
    '… = 24 / 8 = 3; choose h among 1, 2, 3 (d_k even), or choose the positional encoding sinusoidal');
  assert.equal(U.uiWords('cross-attention adds each one\'s own encoding instead: use positional_encoding "sinusoidal" or "none"'),
    'cross-attention adds each one\'s own encoding instead: choose the positional encoding sinusoidal or none');
  assert.equal(U.uiWords('num_kv_heads 3 must divide num_heads 4'), 'K/V heads 3 must divide h = 4');
  assert.equal(U.uiWords('window must be a positive integer (how many keys a query sees, its own included) or null, got -2'),
    'window must be a positive integer (how many keys a query sees, its own included) or empty, got -2');
  assert.equal(U.uiWords('the sentence is empty'), 'the sentence is empty', 'nothing else changes');
});

test('a stack: the layers and the preset join the request only when set, in the declaration\'s order', () => {
  const plain = U.requestFrom(fields()).body;
  assert.ok(!('block' in plain) && !('num_layers' in plain), 'attention alone: the request as before');
  const { body, errors } = U.requestFrom(fields({ block: 'gpt2', num_layers: ' 3 ', causal: true }));
  assert.deepEqual(errors, {});
  assert.equal(JSON.stringify(body), '{"sentence":"the cat sat","d_model":24,"num_heads":1,"seed":0,"scale":true,'
    + '"causal":true,"positional_encoding":"sinusoidal","num_layers":3,"block":"gpt2"}');
  assert.equal(JSON.stringify(U.requestFrom(fields({ block: 'llama' })).body).endsWith(',"block":"llama"}'), true,
    'one layer of a block: num_layers left to its default');
  // More than one layer without a block is sent: the service's 422 says what to do (layers_need_block).
  assert.equal(U.requestFrom(fields({ num_layers: '2' })).body.num_layers, 2);
  const bad = U.requestFrom(fields({ block: 'gpt2', num_layers: 'three' }));
  assert.deepEqual(bad.errors, { '/num_layers': 'enter a whole number, 1 or more' });
  assert.equal(bad.body.num_layers, null);
  assert.equal(U.requestFrom(fields({ num_layers: '' })).body.num_layers, null, 'an empty count is not one');
});

test('a preset sets the mask and positions it chooses outside the block, as the engine\'s presets do', () => {
  assert.deepEqual(U.BLOCKS, ['vaswani2017', 'gpt2', 'llama']);
  const f = fields({ causal: false, positional_encoding: 'none', num_heads: '4' });
  assert.deepEqual(U.withPreset(f, 'llama'), { ...f, block: 'llama', positional_encoding: 'rope', causal: true });
  assert.deepEqual(U.withPreset(f, 'gpt2'), { ...f, block: 'gpt2', positional_encoding: 'sinusoidal', causal: true });
  assert.deepEqual(U.withPreset({ ...f, causal: true }, 'vaswani2017'),
    { ...f, block: 'vaswani2017', positional_encoding: 'sinusoidal', causal: false });
  assert.deepEqual(U.withPreset(f, ''), { ...f, block: '' }, 'none: the inputs as they are');
  assert.ok(Object.isFrozen(U.PRESET_FIELDS.llama));
});

test('a stack in the address: block, layers, the layer shown and the box, each only when used', () => {
  const stack = fields({ block: 'gpt2', num_layers: '3', causal: true });
  const hash = U.hashFor(stack, { query: 1, head: 0, step: null, layer: 2, bstage: 'norm2' });
  assert.equal(hash, '#sentence=the+cat+sat&d_model=24&num_heads=1&seed=0&scale=1&causal=1&layers=3&block=gpt2'
    + '&layer=2&bstage=norm2&q=1&head=0');
  assert.deepEqual(U.fieldsFromHash(hash), stack);
  assert.deepEqual(U.selectionFromHash(hash), { step: null, query: 1, head: 0, colour: 'auto', present: false, slide: null,
    layer: 2, bstage: 'norm2' });
  const plain = U.hashFor(fields(), { query: 1, head: 0, step: null, layer: null, bstage: null });
  assert.ok(!/block|layers|layer=|bstage/.test(plain), plain);
  assert.equal(U.hashFor(null, { query: 0, head: 1, step: null, layer: 0, bstage: 'ffn' }), '#layer=0&bstage=ffn&q=0&head=1',
    'a saved stack: its selection only');
  // What the address cannot hold falls back to the default.
  const f = U.fieldsFromHash('#block=bert&layers=-2');
  assert.equal(f.block, '');
  assert.equal(f.num_layers, '1');
  assert.equal(U.fieldsFromHash('#layers=96').num_layers, '96', 'the service judges the count');
  const sel = U.selectionFromHash('#layer=1.5&bstage=</script>');
  assert.equal(sel.layer, null);
  assert.equal(sel.bstage, null);
  assert.equal(U.selectionFromHash('#layer=1234').layer, null, 'at most 3 digits');
  assert.equal(U.selectionFromHash('#layer=07').layer, 7);
});

test('a saved stack shows the fields it was made with', () => {
  const doc = { config: { d_model: 8, num_heads: 2, seed: 0, scale: true, causal: true, positional_encoding: 'sinusoidal' },
    tokens: [{ text: 'x' }] };
  const shown = U.fieldsFromTrace({ sentence: 'x', block: 'gpt2', num_layers: 3 }, doc);
  assert.equal(shown.block, 'gpt2');
  assert.equal(shown.num_layers, '3');
  assert.equal(U.fieldsFromTrace({ sentence: 'x' }, { ...doc, config: { ...doc.config, block: 'llama', num_layers: 2 } }).block,
    'llama', 'or from the config the answer echoes');
  assert.deepEqual(U.requestFrom(shown).body, { sentence: 'x', d_model: 8, num_heads: 2, seed: 0, scale: true, causal: true,
    positional_encoding: 'sinusoidal', block: 'gpt2', num_layers: 3 });
});

test('uiWords: a stack\'s messages name the controls', () => {
  assert.equal(U.uiWords('num_layers 3 stacks Transformer blocks, and no block is asked for: give block ("vaswani2017", '
    + '"gpt2" or "llama") or a block setting (norm, norm_position, ffn, d_ff, norm_eps, norm_weights), or drop num_layers '
    + 'for the single attention layer'), 'Layers 3 stacks Transformer blocks, and no block is asked for: choose a Block '
    + '("vaswani2017", "gpt2" or "llama") or a block setting (norm, norm_position, ffn, d_ff, norm_eps, norm_weights), or '
    + 'set Layers to 1 for the single attention layer');
  assert.equal(U.uiWords('… a stack of blocks keeps a cache per layer, which is not traced: drop decode, or the block fields'),
    '… a stack of blocks keeps a cache per layer, which is not traced: switch KV-cache decoding off, or choose Block: none');
  assert.equal(U.uiWords('… drop the context, or drop the block fields to trace cross-attention alone'),
    '… clear the context sentence and tokens, or choose Block: none to trace cross-attention alone');
});

test('the projector text scale joins the address only when set, and only as one of the offered scales', () => {
  const sel = { query: 1, head: 0, step: null };
  assert.equal(U.hashFor(null, { ...sel, text: 1 }), '#q=1&head=0');
  assert.equal(U.hashFor(null, { ...sel, text: 1.5 }), '#q=1&head=0&text=150');
  assert.equal(U.selectionFromHash('#q=1&head=0&text=150').text, 1.5);
  assert.equal(U.selectionFromHash('#q=1&head=0&text=200').text, 2);
  for (const bad of ['text=100', 'text=130', 'text=abc', 'text=', '']) assert.equal(U.selectionFromHash(`#q=1&${bad}`).text, undefined, bad);
  assert.deepEqual(U.TEXT_SCALES, [1, 1.25, 1.5, 2]);
});

test('the clicked cell joins the address as its key (q and head name its row and head)', () => {
  const sel = { query: 2, head: 1, step: null };
  assert.equal(U.hashFor(null, { ...sel, key: 0 }), '#q=2&head=1&key=0');
  assert.equal(U.hashFor(null, { ...sel, key: null }), '#q=2&head=1');
  assert.equal(U.selectionFromHash('#q=2&head=1&key=3').key, 3);
  for (const bad of ['key=-1', 'key=1.5', 'key=x', 'key=']) assert.equal(U.selectionFromHash(`#q=1&${bad}`).key, undefined, bad);
});

test('the language-model head: a declared choice, sent as lm_head, kept in the address and read back from an answer', () => {
  const { body } = U.requestFrom(fields({ block: 'gpt2', lm_head: 'tied' }));
  assert.equal(body.lm_head, 'tied');
  assert.equal(U.requestFrom(fields()).body.lm_head, undefined, 'off: the request is as before');
  const hash = U.hashFor(fields({ block: 'gpt2', lm_head: 'tied' }), { query: 0, head: 0, step: null });
  assert.ok(hash.includes('lm=tied'), hash);
  assert.equal(U.fieldsFromHash(hash).lm_head, 'tied');
  assert.equal(U.fieldsFromHash('#block=gpt2').lm_head, '');
  const doc = { config: { d_model: 8, num_heads: 2, seed: 0, scale: true, causal: true, positional_encoding: 'sinusoidal',
    block: 'gpt2', num_layers: 1, lm_head: 'tied', temperature: 1 }, tokens: [{ text: 'x' }] };
  assert.equal(U.fieldsFromTrace({ sentence: 'x', block: 'gpt2', lm_head: 'tied' }, doc).lm_head, 'tied');
});

test('the ablation joins the selection part of the address (ablate=L.H, ablate_mlp=L) only when set', () => {
  const sel = { query: 1, head: 0, step: null, layer: 1, bstage: null };
  assert.equal(U.hashFor(null, { ...sel, ablate: null, ablateMlp: null }), '#layer=1&q=1&head=0');
  const both = U.hashFor(null, { ...sel, ablate: { layer: 0, head: 2 }, ablateMlp: 1 });
  assert.equal(both, '#layer=1&q=1&head=0&ablate=0.2&ablate_mlp=1');
  const back = U.selectionFromHash(both);
  assert.deepEqual(back.ablate, { layer: 0, head: 2 });
  assert.equal(back.ablateMlp, 1);
  assert.equal(U.hashFor(null, { ...sel, ...back }), both, 'the address reads back to itself');
  assert.equal(U.hashFor(null, { ...sel, ablateMlp: 0 }), '#layer=1&q=1&head=0&ablate_mlp=0', 'layer 0 is a layer');
  const plain = U.selectionFromHash('#layer=1&q=1&head=0');
  assert.ok(!('ablate' in plain) && !('ablateMlp' in plain), 'an address without them leaves them out');
  for (const bad of ['ablate=1', 'ablate=1.', 'ablate=.2', 'ablate=-1.0', 'ablate=1.2.3', 'ablate=1e1.0', 'ablate=1234.0',
    'ablate=</script>']) assert.equal(U.selectionFromHash(`#q=1&${bad}`).ablate, undefined, bad);
  for (const bad of ['ablate_mlp=-1', 'ablate_mlp=1.5', 'ablate_mlp=abc', 'ablate_mlp=1234', 'ablate_mlp=']) {
    assert.equal(U.selectionFromHash(`#q=1&${bad}`).ablateMlp, undefined, bad);
  }
});
