/* format.js: numbers as the page writes them, and the maps' colour scale. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const { load } = require('./load.js');

const F = load('format.js').format;
const MINUS = '\u2212';

test('fmt rounds as toFixed does, with a real minus sign and no negative zero', () => {
  assert.equal(F.MINUS, MINUS);
  assert.equal(F.fmt(4.0604), '4.0604');
  assert.equal(F.fmt(0.26054088816854076, 4), '0.2605');
  assert.equal(F.fmt(-1.23456, 2), `${MINUS}1.23`);
  assert.equal(F.fmt(-1.23456, 2).codePointAt(0), 0x2212);
  assert.ok(!F.fmt(-7.5, 3).includes('-'), 'never a hyphen-minus');
  // 0.125 is an exact binary tie: toFixed rounds it away from zero; 1.005 is just below its tie in binary.
  assert.equal(F.fmt(0.125, 2), '0.13');
  assert.equal(F.fmt(-0.125, 2), `${MINUS}0.13`);
  assert.equal(F.fmt(1.005, 2), '1.00');
  // A tiny negative number rounds to zero, and reads as zero, not "−0.0000".
  assert.equal(F.fmt(-0.00001, 4), '0.0000');
  assert.equal(F.fmt(-0, 4), '0.0000');
  assert.equal(F.fmt(-0.4, 0), '0');
  assert.equal(F.fmt(-0.6, 0), `${MINUS}1`);
  assert.equal(F.fmt(12345.678, 1), '12345.7');
});

test('fmt writes a masked cell (null) as "masked", never as a number', () => {
  assert.equal(F.fmt(null), 'masked');
  assert.equal(F.fmt(undefined, 2), 'masked');
});

test('pct: a weight as a percentage, 1 decimal unless asked', () => {
  // The walkthrough of "the cat sat" (docs/viewer.md): "cat" keeps 58.0% of its own value.
  assert.equal(F.pct(0.58), '58.0%');
  assert.equal(F.pct(0.4478206877535929), '44.8%');
  assert.equal(F.pct(0.9990000000000001), '99.9%');
  assert.equal(F.pct(1), '100.0%');
  assert.equal(F.pct(0), '0.0%');
  assert.equal(F.pct(0.5, 2), '50.00%');
  assert.equal(F.pct(0.0004, 0), '0%');
  assert.equal(F.pct(-1e-9), '0.0%');
});

test('fmtSmall: 4 decimals, or 4 significant digits for a tiny non-zero number', () => {
  assert.equal(F.fmtSmall(0), '0.0000');
  assert.equal(F.fmtSmall(12.3456789), '12.3457');
  assert.equal(F.fmtSmall(0.001), '0.0010');
  assert.equal(F.fmtSmall(0.0004567), '4.567e' + MINUS + '4');
  assert.equal(F.fmtSmall(-0.0004567), `${MINUS}4.567e${MINUS}4`);
  assert.equal(F.fmtSmall(1e-300), `1.000e${MINUS}300`);
  assert.equal(F.fmtSmall(null), 'masked');
  assert.equal(F.fmtExp(1.2e-16), `1.2e${MINUS}16`);
  assert.equal(F.fmtExp(3.25e5, 2), '3.25e+5');
});

test('int, quoted and fmtBase', () => {
  assert.equal(F.int(2304), '2,304');
  assert.equal(F.int(1234567), '1,234,567');
  assert.equal(F.int(12), '12');
  assert.equal(F.quoted('cat'), '“cat”');
  assert.equal(F.fmtBase(10000), '10000');
  assert.equal(F.fmtBase(500000.5), '500000.5');
});

test('extent skips masked cells; unit places a value in it', () => {
  assert.deepEqual(F.extent([[1, null, -2], [3]]), [-2, 3]);
  assert.deepEqual(F.extent([[[0.5]], [[null, 0.25]]]), [0.25, 0.5]);
  assert.deepEqual(F.extent([[null, null]]), [0, 1]);
  assert.deepEqual(F.extent([]), [0, 1]);
  assert.equal(F.unit(-2, [-2, 3]), 0);
  assert.equal(F.unit(3, [-2, 3]), 1);
  assert.equal(F.unit(0.5, [-2, 3]), 0.5);
  assert.equal(F.unit(7, [7, 7]), 0.5, 'a range of one value sits mid-scale');
  assert.equal(F.norm([3, 4]), 5);
  assert.equal(F.norm([]), 0);
});

// WCAG relative luminance and contrast, from #rrggbb.
function luminance(hex) {
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255)
    .map((c) => (c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
const contrast = (a, b) => {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
};

test('the colour scale runs from style.css\'s light end to its dark end', () => {
  const hex = (rgb) => `#${rgb.map((c) => c.toString(16).padStart(2, '0')).join('')}`;
  assert.equal(F.scaleColour(0), hex(F.HM_LO));
  assert.equal(F.scaleColour(1), hex(F.HM_HI));
  assert.equal(F.scaleColour(0), '#f4f7fb');
  assert.equal(F.scaleColour(1), '#0b2a55');
  for (let i = 0; i <= 20; i += 1) assert.match(F.scaleColour(i / 20), /^#[0-9a-f]{6}$/);
  // Oklab there and back keeps a colour (to the byte).
  for (const rgb of [[0, 0, 0], [255, 255, 255], [0x0b, 0x2a, 0x55], [200, 30, 90]]) {
    assert.deepEqual(F.fromOklab(F.toOklab(rgb)), rgb);
  }
});

test('the colour scale darkens monotonically: it reads in greyscale', () => {
  let previous = Infinity;
  for (let i = 0; i <= 100; i += 1) {
    const y = luminance(F.scaleColour(i / 100));
    assert.ok(y < previous, `luminance rises at t = ${i / 100}`);
    previous = y;
  }
  let lightness = Infinity;
  for (let i = 0; i <= 100; i += 1) {
    const [L] = F.toOklab([1, 3, 5].map((k) => parseInt(F.scaleColour(i / 100).slice(k, k + 2), 16)));
    assert.ok(L <= lightness + 1e-12, `Oklab lightness rises at t = ${i / 100}`);
    lightness = L;
  }
});

test('the ink flips at 0.6, and every cell\'s number has at least 4.5:1 contrast', () => {
  assert.equal(F.ON_DARK_AT, 0.6);
  assert.equal(F.inkOn(0), '#000000');
  assert.equal(F.inkOn(0.6), '#000000');
  assert.equal(F.inkOn(0.6001), '#ffffff');
  assert.equal(F.inkOn(1), '#ffffff');
  for (let i = 0; i <= 1000; i += 1) {
    const t = i / 1000;
    const ratio = contrast(F.scaleColour(t), F.inkOn(t));
    assert.ok(ratio >= 4.5, `contrast ${ratio.toFixed(2)}:1 at t = ${t}`);
  }
});

test('shellQuote makes one shell word that the shell gives back unchanged', () => {
  assert.equal(F.shellQuote("it's"), "'it'\\''s'");
  for (const s of ["it's", 'a "b" $HOME `x` \\n', "''", '', 'line\nbreak', '{"sentence":"don\'t"}']) {
    assert.equal(execFileSync('/bin/sh', ['-c', `printf %s ${F.shellQuote(s)}`], { encoding: 'utf8' }), s);
  }
});

test('mapScale: weights on 0 … 1, on the map\'s largest, or on each row\'s; the legend in the cells\' unit', () => {
  const W = [[1, 0], [0.2, 0.05], [0.1, 0.3]];
  const abs = F.mapScale(W, { kind: 'weight' });
  assert.equal(abs.mode, 'abs');
  assert.deepEqual([abs.lo, abs.hi], ['0.00', '1.00']);
  assert.equal(abs.t(1, 0.2), 0.2);
  const masked = (i, j) => i === 0 && j === 0; // the 1 is masked: out of the map's range
  const map = F.mapScale(W, { kind: 'weight', mode: 'map', isMasked: masked });
  assert.deepEqual([map.lo, map.hi], ['0.00', '0.30']);
  assert.equal(map.t(2, 0.3), 1);
  assert.ok(Math.abs(map.t(1, 0.2) - 2 / 3) < 1e-15);
  const row = F.mapScale(W, { kind: 'weight', mode: 'row' });
  assert.deepEqual([row.lo, row.hi], ['0.00', 'row max']);
  assert.equal(row.t(1, 0.2), 1);
  assert.equal(row.t(1, 0.05), 0.25);
  assert.equal(row.t(2, 0.3), 1);
  assert.deepEqual(row.ranges, [[0, 1], [0, 0.2], [0, 0.3]]);
});

test('mapScale: scores on the map\'s range (they have no fixed one), or each row\'s; nulls take no part', () => {
  const S = [[-2, null, 4], [1, 2, 3]];
  for (const mode of ['abs', 'map']) {
    const s = F.mapScale(S, { mode });
    assert.deepEqual([s.lo, s.hi], [`${F.MINUS}2.00`, '4.00'], mode);
    assert.equal(s.t(1, 1), 0.5);
  }
  const row = F.mapScale(S, { mode: 'row' });
  assert.deepEqual([row.lo, row.hi], ['row min', 'row max']);
  assert.deepEqual(row.ranges, [[-2, 4], [1, 3]]);
  assert.equal(row.t(1, 2), 0.5);
  assert.equal(F.mapScale(S, { mode: 'rainbow' }).mode, 'abs', 'an unknown mode is the default');
  assert.equal(F.mapScale([[5, 5]], { mode: 'row' }).t(0, 5), 0.5, 'one value: mid-scale');
  assert.deepEqual(F.SCALE_MODES, ['auto', 'abs', 'map', 'row']);
});

test('mapScale auto: 0 … 1 up to 12 rows, each row\'s largest above, and it says it chose', () => {
  const uniform = (n) => Array.from({ length: n }, () => Array.from({ length: n }, () => 1 / n));
  const short = F.mapScale(uniform(12), { kind: 'weight', mode: 'auto' });
  assert.deepEqual([short.mode, short.auto, short.lo, short.hi], ['abs', true, '0.00', '1.00']);
  for (const n of [13, 30, 60]) {
    const long = F.mapScale(uniform(n), { kind: 'weight', mode: 'auto' });
    assert.deepEqual([long.mode, long.auto, long.hi], ['row', true, 'row max'], String(n));
    assert.equal(long.t(0, 1 / n), 1, 'a uniform row is the darkest colour, not near-white');
  }
  assert.equal(F.mapScale(uniform(30), { kind: 'weight', mode: 'abs' }).auto, false, 'a scale chosen by hand');
});

test('subscript: head numbers as the formulas write them', () => {
  assert.equal(F.subscript(0), '₀');
  assert.equal(F.subscript(12), '₁₂');
});
