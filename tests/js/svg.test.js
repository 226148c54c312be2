/* svg.js: the SVG exports, well-formed whatever the tokens, with the page's numbers and colours. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { load } = require('./load.js');
const { parseXml, walk, textOf } = require('./xml.js');

const AT = load('format.js', 'trace.js', 'svg.js');
const S = AT.svg;
const F = AT.format;
const MINUS = '\u2212';

const HOSTILE = ['</text><script>alert(1)</script>', 'a&b', '"q" \'s\'', '<!--', ']]>', 'tab\there'];

/** A causal trace of `words` with 2 heads, shaped as /trace answers (only what the drawings read). */
function fakeTrace(words, { scale = true, context = null } = {}) {
  const n = words.length;
  const keys = context || words;
  const m = keys.length;
  const causal = context === null;
  const row = (i) => Array.from({ length: m }, (_, j) => (causal && j > i ? null : (i + 1) * (j - 1.5) * (scale ? 0.5 : 1)));
  const scores = [0, 1].map(() => Array.from({ length: n }, (_, i) => row(i)));
  const weights = scores.map((hm) => hm.map((r) => {
    const e = r.map((v) => (v === null ? 0 : Math.exp(v)));
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  }));
  const tokens = words.map((text, index) => ({ index, text }));
  return {
    engine_version: '1.0.0',
    config: { d_model: 8, num_heads: 2, d_k: 4, seed: 0, scale, causal, positional_encoding: 'sinusoidal',
      scale_factor: scale ? 2 : 1 },
    tokens,
    ...(context ? { context_tokens: context.map((text, index) => ({ index, text })) } : {}),
    stages: { scores: { values: scores }, masked_scores: causal ? { values: scores } : undefined, weights: { values: weights } },
    stats: { entropy: [0, 1].map(() => words.map((_, i) => 0.5 + i)), max_weight: [0, 1].map(() => words.map(() => 0.75)) },
  };
}

function weightsSpec(doc, head) {
  const masked = doc.stages.masked_scores;
  return { stage: 'weights', title: 'Weights', formula: 'softmax: rows sum to 1', matrix: doc.stages.weights.values[head],
    tokens: doc.tokens, keyTokens: doc.context_tokens, range: [0, 1], kind: 'weight',
    maskRow: masked ? (i, j) => masked.values[head][i][j] === null : null, showMasked: !!masked };
}

const byClass = (root, cls) => [...walk(root)].find((el) => el.attrs.class === cls);

test('the XML writer escapes every text and attribute value', () => {
  const el = S.node('text', { 'data-x': 'a"b<c>&d\te\nf\r', skip: null, gone: undefined, zero: 0 },
    '<b>&amp;</b> "q" \'s\'', null, false, undefined, ['x', ['y']], 7);
  assert.equal(S.toXml(el), '<text data-x="a&quot;b&lt;c&gt;&amp;d&#9;e&#10;f&#13;" zero="0">'
    + '&lt;b&gt;&amp;amp;&lt;/b&gt; "q" \'s\'xy7</text>');
  assert.equal(S.toXml(S.node('rect', { width: 2 })), '<rect width="2"/>');
  assert.equal(S.toXml(S.node('g', {}, S.node('title', {}), S.node('desc', {}, ''))), '<g><title/><desc></desc></g>');
  // Characters XML 1.0 cannot hold become U+FFFD; a whole astral character stays.
  assert.equal(S.toXml(S.node('t', { a: 'x\u0001y' }, 'bell\u0007 \uFFFF \uD800 🐈 \u2028')),
    '<t a="x\uFFFDy">bell\uFFFD \uFFFD \uFFFD 🐈 \u2028</t>');
  const back = parseXml(S.svgFile(S.node('svg', { title: HOSTILE.join('|') }, HOSTILE.map((t) => S.node('text', {}, t)))));
  assert.equal(back.attrs.title, HOSTILE.join('|'));
  assert.deepEqual(back.children.map(textOf), HOSTILE);
});

test('append adds children as node() takes them', () => {
  const g = S.append(S.node('g', {}), S.node('a', {}), [null, 'x', [S.node('b', {})]]);
  assert.equal(S.toXml(g), '<g><a/>x<b/></g>');
});

test('a map as SVG: well-formed, with the tokens exactly, escaped, and every cell\'s number', () => {
  const words = ['the', ...HOSTILE.slice(0, 4)];
  const doc = fakeTrace(words);
  const text = S.svgFile(S.heatmapSvg(weightsSpec(doc, 1), { doc, head: 1 }));
  assert.ok(text.startsWith('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" '));
  assert.ok(text.endsWith('</svg>\n'));
  assert.ok(!text.includes('<script') && !text.includes('<!--'), 'a token cannot open markup');
  const root = parseXml(text);
  assert.equal(root.tag, 'svg');
  const tags = new Set([...walk(root)].map((el) => el.tag));
  for (const tag of tags) assert.ok(['svg', 'title', 'desc', 'rect', 'defs', 'pattern', 'linearGradient', 'stop', 'text', 'g'].includes(tag), tag);
  assert.ok(![...walk(root)].some((el) => Object.keys(el.attrs).some((k) => /href$|^on|^style$/.test(k))), 'no link, handler or style');
  assert.equal(root.attrs.viewBox, `0 0 ${root.attrs.width} ${root.attrs.height}`);

  const lines = root.children.filter((el) => el.tag === 'text').map(textOf);
  assert.equal(lines[0], 'Weights · head 1 of 2 · softmax: rows sum to 1');
  assert.equal(lines[1], `“${words.join(' ')}”`);
  assert.equal(lines[2], 'd_model 8 · 2 heads of d_k 4 · seed 0 · scaled ÷ √4 · causal · positional encoding sinusoidal · engine 1.0.0');
  assert.deepEqual(byClass(root, 'col-labels').children.map(textOf), words);
  assert.deepEqual(byClass(root, 'row-labels').children.map(textOf), words);

  const cells = byClass(root, 'cells').children;
  assert.equal(cells.length, words.length ** 2);
  const W = doc.stages.weights.values[1];
  for (const g of cells) {
    const i = Number(g.attrs['data-row']);
    const j = Number(g.attrs['data-col']);
    const [title, rect, label] = g.children;
    const masked = j > i;
    assert.equal(g.attrs['data-value'], String(W[i][j]));
    assert.equal(textOf(label), masked ? 'masked' : F.fmt(W[i][j], 2));
    assert.equal(textOf(title), `query “${words[i]}” → key “${words[j]}”: `
      + (masked ? 'masked' : `${F.fmt(W[i][j], 4)} (${F.pct(W[i][j], 2)})`));
    assert.equal(rect.attrs.fill, masked ? 'url(#masked)' : F.scaleColour(W[i][j]));
    if (!masked) assert.equal(label.attrs.fill, F.inkOn(W[i][j]));
  }
  const legend = byClass(root, 'legend').children.filter((el) => el.tag === 'text').map(textOf);
  // The legend in the cells' unit: fractions, as the cells are written.
  assert.deepEqual(legend, ['colour scale', '0.00', '1.00', 'masked: excluded from the softmax (weight 0)']);
  const stops = [...walk(root)].filter((el) => el.tag === 'stop');
  assert.deepEqual(stops.map((s) => s.attrs['stop-color']), Array.from({ length: 11 }, (_, i) => F.scaleColour(i / 10)));
  assert.deepEqual([stops[0].attrs['stop-color'], stops[10].attrs['stop-color']], ['#f4f7fb', '#0b2a55']);
});

test('a scores map: its legend is the range, with the page\'s minus sign', () => {
  const doc = fakeTrace(['a', 'b', 'c']);
  const matrix = doc.stages.scores.values[0];
  const range = F.extent(matrix);
  const spec = { stage: 'scores', title: 'Scores', formula: 'QKᵀ', matrix, tokens: doc.tokens, range, kind: 'score' };
  const root = parseXml(S.svgFile(S.heatmapSvg(spec, { doc, head: 0 })));
  const legend = byClass(root, 'legend').children.filter((el) => el.tag === 'text').map(textOf);
  assert.deepEqual(range, [-2.25, 0.75], 'the masked cells are no part of the range');
  assert.deepEqual(legend, ['colour scale', `${MINUS}2.25`, '0.75']);
  const masked = byClass(root, 'cells').children.filter((g) => g.attrs['data-value'] === 'null');
  assert.equal(masked.length, 3);
  assert.ok(masked.every((g) => textOf(g.children[2]) === 'masked' && g.children[1].attrs.fill === 'url(#masked)'));
});

test('cross-attention labels the columns with the context, as "context key"', () => {
  const doc = fakeTrace(['the', 'cat'], { context: ['le', 'chat', 'était assis'] });
  const root = parseXml(S.svgFile(S.heatmapSvg(weightsSpec(doc, 0), { doc, head: 0 })));
  assert.deepEqual(byClass(root, 'col-labels').children.map(textOf), ['le', 'chat', 'était assis']);
  assert.ok(textOf(root).includes('context key →'));
  assert.ok(textOf(root).includes('cross-attention to “le chat était assis”'));
  assert.equal(byClass(root, 'cells').children.length, 6);
});

test('long sentences: colours only above 12 tokens, the first 48 above 48', () => {
  for (const [n, cells, numbers] of [[12, 144, true], [13, 169, false], [60, 48 * 48, false]]) {
    const doc = fakeTrace(Array.from({ length: n }, (_, i) => `t${i}`));
    const root = parseXml(S.svgFile(S.heatmapSvg(weightsSpec(doc, 0), { doc, head: 0 })));
    const gs = byClass(root, 'cells').children;
    assert.equal(gs.length, cells, `${n} tokens`);
    assert.equal(gs.every((g) => g.children.length === 3), numbers, `${n} tokens: numbers on the cells`);
    assert.ok(gs.every((g) => g.children[0].tag === 'title'), 'each cell keeps its exact value');
  }
});

test('the scaled/unscaled comparison as SVG', () => {
  const words = ['the', 'cat', 'a&b'];
  const scaled = fakeTrace(words);
  const unscaled = fakeTrace(words, { scale: false });
  for (const [main, alt] of [[scaled, unscaled], [unscaled, scaled]]) { // whichever is on screen
    const root = parseXml(S.svgFile(S.comparisonSvg(main, alt, { query: 1, head: 0 })));
    const texts = [...walk(root)].filter((el) => el.tag === 'text').map(textOf);
    assert.equal(texts[0], 'Why divide by √d_k: the weights of “cat” (query 1), head 0');
    assert.equal(texts[2], 'd_model 8 · 2 heads of d_k 4 · seed 0 · causal · positional encoding sinusoidal · engine 1.0.0');
    assert.ok(texts.includes('scaled (÷ √4 = 2.000)') && texts.includes('unscaled (÷ 1)'));
    assert.deepEqual([...walk(root)].filter((el) => el.tag === 'text' && 'data-key' in el.attrs).map(textOf), words);
    for (const [series, doc] of [['scaled', scaled], ['unscaled', unscaled]]) {
      const w = doc.stages.weights.values[0][1];
      const shown = [...walk(root)].filter((el) => el.attrs['data-series'] === series).map((g) => textOf(g.children[1]));
      assert.deepEqual(shown, [F.pct(w[0]), F.pct(w[1]), 'masked'], series);
      assert.ok(texts.includes(`${series}: entropy ${F.fmt(1.5, 3)} nats · max weight 75.0%`), series);
    }
  }
});

test('configLines names every variant', () => {
  const doc = fakeTrace(['a']);
  Object.assign(doc.config, { positional_encoding: 'rope', rope_pairing: 'interleaved', rope_base: 500000,
    num_kv_heads: 1, window: 2, scale: false });
  assert.deepEqual(S.configLines(doc), ['“a”', 'd_model 8 · 2 heads of d_k 4 · seed 0 · not scaled (÷ 1) · causal · '
    + 'RoPE interleaved, base 500000 · 1 K/V head · window 2 · engine 1.0.0']);
  assert.equal(S.textWidth('abc'), 3 * 12 * 0.62);
  assert.equal(S.textWidth('🐈'), 12 * 0.62, 'one character, not two UTF-16 units');
});

test('a map as SVG on the other colour scales: the map\'s largest weight, or each row\'s', () => {
  const doc = fakeTrace(['a', 'b', 'c', 'd']);
  const W = doc.stages.weights.values[0];
  const masked = (i, j) => j > i;
  for (const mode of ['map', 'row']) {
    const spec = { ...weightsSpec(doc, 0), mode };
    const root = parseXml(S.svgFile(S.heatmapSvg(spec, { doc, head: 0 })));
    const scale = F.mapScale(W, { kind: 'weight', mode, isMasked: masked });
    for (const g of byClass(root, 'cells').children) {
      const i = Number(g.attrs['data-row']);
      const j = Number(g.attrs['data-col']);
      if (masked(i, j)) continue;
      assert.equal(g.children[1].attrs.fill, F.scaleColour(scale.t(i, W[i][j])), `${mode} ${i} ${j}`);
    }
    const legend = byClass(root, 'legend');
    assert.equal(legend.attrs['data-mode'], mode);
    const ends = legend.children.filter((el) => el.tag === 'text').map(textOf).slice(1, 3);
    assert.deepEqual(ends, mode === 'map' ? ['0.00', F.fmt(Math.max(...W.flat()), 2)] : ['0.00', 'row max (each row on its own scale)']);
  }
});

test('the caption is the sentence as typed, not the tokens put back together', () => {
  const doc = fakeTrace(['The', 'animal', 'didn', "'", 't', 'cross', '.']);
  const root = parseXml(S.svgFile(S.heatmapSvg(weightsSpec(doc, 0), { doc, head: 0, sentence: "The animal  didn't cross." })));
  assert.equal(root.children.filter((el) => el.tag === 'text').map(textOf)[1], "“The animal  didn't cross.”");
  const cmp = parseXml(S.svgFile(S.comparisonSvg(doc, fakeTrace(doc.tokens.map((t) => t.text), { scale: false }),
    { query: 1, head: 0, sentence: "The animal  didn't cross." })));
  assert.ok([...walk(cmp)].some((el) => el.tag === 'text' && textOf(el) === "“The animal  didn't cross.”"));
  assert.equal(S.configLines(doc)[0], "“The animal didn ' t cross .”", 'without it, the tokens, spaced');
});

test('27 keys: the column labels stand upright, one text line a column apart, so none overlaps the next', () => {
  const words = Array.from({ length: 27 }, (_, i) => ['because', 'tired', 'animal', 'the', ','][i % 5]);
  const doc = fakeTrace(words);
  const root = parseXml(S.svgFile(S.heatmapSvg(weightsSpec(doc, 0), { doc, head: 0 })));
  const labels = byClass(root, 'col-labels');
  const size = Number(labels.attrs['font-size']);
  const xs = labels.children.map((t) => {
    const m = /^translate\(([\d.]+) ([\d.]+)\) rotate\(-90\)$/.exec(t.attrs.transform);
    assert.ok(m, t.attrs.transform);
    return Number(m[1]);
  });
  // Upright text is one line `size` high (its glyphs fit in about 1.2 × size); columns are 16 apart.
  for (let j = 1; j < xs.length; j += 1) assert.ok(xs[j] - xs[j - 1] >= size * 1.2, `${xs[j - 1]} → ${xs[j]}`);
  // The labels fit above the grid: the top of the longest is below the title lines.
  const top = Number(labels.children[0].attrs.transform.match(/translate\([\d.]+ ([\d.]+)\)/)[1]);
  assert.ok(top - S.textWidth('because', size) > 20 + 3 * 18, 'the tallest label clears the caption');
});

test('a constructed head\'s map names its kind in the title and the heading; a seeded head\'s does not', () => {
  const doc = fakeTrace(['the', 'cat', 'sat']);
  doc.config.head_weights = ['previous_token', 'seeded'];
  const root = parseXml(S.svgFile(S.heatmapSvg(weightsSpec(doc, 0), { doc, head: 0 })));
  const title = [...walk(root)].find((el) => el.tag === 'title');
  assert.equal(textOf(title), 'Weights, head 0 (previous-token): attention-trace');
  assert.ok([...walk(root)].some((el) => el.tag === 'text' && textOf(el).startsWith('Weights · head 0 (previous-token) of 2')));
  const seeded = parseXml(S.svgFile(S.heatmapSvg(weightsSpec(doc, 1), { doc, head: 1 })));
  assert.equal(textOf([...walk(seeded)].find((el) => el.tag === 'title')), 'Weights, head 1: attention-trace');
});

test('gridsSvg: every grid with its labels and the numbers it was given, escaped, masked cells hatched', () => {
  const doc = fakeTrace(HOSTILE.slice(0, 3));
  const cell = (t, text) => ({ t, text, title: `value ${text} <${t}>` });
  const grids = [
    { caption: 'Q: 3 × 2', rows: HOSTILE.slice(0, 3), cols: ['0', '1'], queryRow: 1,
      cells: [[cell(0, '0.10'), cell(1, `${MINUS}0.20`)], [cell(0.5, '0.30'), cell(0.25, '0.40')], [cell(0, '0.50'), cell(1, '0.60')]] },
    { caption: 'scores & more', rows: ['a', 'b'], cols: ['<k>', 'k2'], markCol: 1,
      cells: [[cell(null, ''), cell(0.5, '1.00')], [cell(0, ''), cell(0.2, '2.00')]] },
  ];
  const xml = S.svgFile(S.gridsSvg({ heading: 'Q · Kᵀ = scores <head 1>', label: 'a & b', doc, sentence: '</svg> & "x"',
    grids, ops: ['='], notes: ['a note <b>'], legend: { lo: '0.00', hi: '1.00' } }));
  const root = parseXml(xml);
  const texts = [...walk(root)].filter((n) => n.tag === 'text').map(textOf);
  assert.equal(texts[0], 'Q · Kᵀ = scores <head 1>');
  assert.ok(texts.includes('“</svg> & "x"”'));
  for (const label of [...HOSTILE.slice(0, 3).filter((_, i) => i !== 1), '▸ ' + HOSTILE[1], '<k>', 'Q: 3 × 2', 'scores & more', '=', 'a note <b>']) {
    assert.ok(texts.includes(label), label);
  }
  const numbers = [...walk(root)].filter((n) => n.tag === 'g' && 'data-row' in n.attrs && 'data-col' in n.attrs)
    .map((n) => n.children.find((c) => c.tag === 'text')).map((t) => (t ? textOf(t) : ''));
  assert.deepEqual(numbers,
    ['0.10', `${MINUS}0.20`, '0.30', '0.40', '0.50', '0.60', '', '1.00', '', '2.00']);
  assert.ok(xml.includes('fill="url(#masked)"'), 'a masked cell is hatched');
  assert.ok(xml.includes('class="query-row"') && xml.includes('class="marked-col"'));
  assert.match(xml, /<svg [^>]*width="\d+" height="\d+"/);
});
