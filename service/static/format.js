/*
 * attention-trace viewer: how the page writes numbers and colours. Pure: no DOM, no state.
 *
 * Numbers are rounded with toFixed and written with a real minus sign (U+2212), never as "-0.000"; weights are
 * also shown as percentages. The colour scale is the one style.css draws the maps with (one hue, light to dark,
 * mixed in Oklab), computed here for the SVG exports, with the point where the ink flips from black to white.
 *
 * Loaded first (index.html), as a classic script: it adds `format` to the page's one namespace,
 * globalThis.AttentionTrace. tests/js/format.test.js runs it under Node.
 */
'use strict';

(() => {
  const MINUS = '\u2212';

  /** Fixed decimals with a real minus sign and no "-0.000"; null (a masked cell) reads "masked". */
  function fmt(x, digits = 4) {
    if (x === null || x === undefined) return 'masked';
    let s = x.toFixed(digits);
    if (s.startsWith('-')) s = /^-[0.]*$/.test(s) ? s.slice(1) : MINUS + s.slice(1);
    return s;
  }

  /** A weight as a percentage: 0.58 → "58.0%". */
  const pct = (w, digits = 1) => `${fmt(w * 100, digits)}%`;

  /** 4 decimals, or 4 significant digits for a tiny non-zero number (an exponential, say), never a bare 0.0000. */
  function fmtSmall(x) {
    if (x === null || x === undefined) return 'masked';
    if (x !== 0 && Math.abs(x) < 0.001) return x.toExponential(3).replace(/-/g, MINUS);
    return fmt(x, 4);
  }

  /** Exponential notation with a real minus sign: 1.2e−16. */
  const fmtExp = (x, digits = 1) => x.toExponential(digits).replace(/-/g, MINUS);

  /** A count with thousands separators: 2304 → "2,304". */
  const int = (n) => n.toLocaleString('en-US');

  /** A token in typographic quotes. */
  const quoted = (t) => `“${t}”`;

  /** A whole number in subscript digits: 12 → "₁₂" (head₁₂). */
  const subscript = (n) => String(n).replace(/\d/g, (d) => '₀₁₂₃₄₅₆₇₈₉'[d]);

  /** A number from the JSON as the request wrote it: 10000.0 arrives as 10000 and prints so. */
  const fmtBase = (base) => String(base);

  /** [min, max] over the numbers of a nested array, skipping nulls (masked cells); [0, 1] when there are none. */
  function extent(values) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const v of values.flat(Infinity)) {
      if (v === null) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (lo === Infinity) return [0, 1];
    return [lo, hi];
  }

  /** v's place in [lo, hi] as 0 … 1; 0.5 for a range of one value. */
  const unit = (v, [lo, hi]) => (hi > lo ? (v - lo) / (hi - lo) : 0.5);

  /** The colour scales a map can be drawn on (the page's select, the address's `colour`, the SVG exports). */
  const SCALE_MODES = Object.freeze(['auto', 'abs', 'map', 'row']);
  /** 'auto' colours a map on 0 … 1 up to this many rows, each row on its own above (a long sentence spreads its
   * weights thin: at 30 tokens 0 … 1 left 810 of 900 cells near-white). */
  const AUTO_ROW_ABOVE = 12;

  /**
   * How one map's cells are coloured, and its legend. `mode`:
   *   'abs'  weights on 0 … 1 (scores, which have no fixed range, on the map's min … max);
   *   'map'  weights on 0 … the map's largest weight (scores on the map's min … max);
   *   'row'  each row on its own: weights on 0 … the row's largest, scores on the row's min … max;
   *   'auto' (the default) 'abs' up to AUTO_ROW_ABOVE rows, 'row' above: `mode` is the one chosen, `auto` true.
   * Masked cells (null, or isMasked(i, j)) take no part. Returns {mode, t(i, v): v's place on row i's scale, 0 … 1;
   * lo, hi: the legend's two ends, in the unit the cells are written in (weights as fractions, 2 decimals, as the
   * cells show them; "row max" when each row has its own); ranges: each row's [lo, hi]}.
   */
  function mapScale(matrix, { kind = 'score', mode = 'abs', isMasked = null } = {}) {
    const auto = mode === 'auto' || !SCALE_MODES.includes(mode);
    const m = auto ? (matrix.length > AUTO_ROW_ABOVE ? 'row' : 'abs') : mode;
    const weight = kind === 'weight';
    const shown = (i) => matrix[i].filter((v, j) => v !== null && !(isMasked && isMasked(i, j)));
    const rows = matrix.map((_, i) => shown(i));
    let ranges;
    let lo;
    let hi;
    if (m === 'row') {
      ranges = rows.map((r) => { const [a, b] = extent(r); return weight ? [0, b] : [a, b]; });
      lo = weight ? fmt(0, 2) : 'row min';
      hi = 'row max';
    } else {
      const [a, b] = extent(rows);
      const range = weight ? [0, m === 'map' ? b : 1] : [a, b];
      ranges = rows.map(() => range);
      lo = fmt(range[0], 2);
      hi = fmt(range[1], 2);
    }
    return { mode: m, auto, t: (i, v) => Math.min(1, Math.max(0, unit(v, ranges[i]))), lo, hi, ranges };
  }

  /** The Euclidean length of a vector. */
  function norm(v) {
    return Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  }

  // ---------------------------------------------------------------- the colour scale

  // As style.css draws the maps: color-mix(in oklab, --hm-hi t, --hm-lo).
  const HM_LO = Object.freeze([0xf4, 0xf7, 0xfb]);
  const HM_HI = Object.freeze([0x0b, 0x2a, 0x55]);
  // Above this t the ink is white: where black and white ink have equal contrast (4.6:1) on the scale.
  const ON_DARK_AT = 0.6;

  function toOklab(rgb) {
    const [r, g, b] = rgb.map((c) => { const x = c / 255; return x <= 0.04045 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; });
    const l = Math.cbrt(0.4122214708 * r + 0.5363325363 * g + 0.0514459929 * b);
    const m = Math.cbrt(0.2119034982 * r + 0.6806995451 * g + 0.1073969566 * b);
    const s = Math.cbrt(0.0883024619 * r + 0.2817188376 * g + 0.6299787005 * b);
    return [0.2104542553 * l + 0.7936177850 * m - 0.0040720468 * s, 1.9779984951 * l - 2.4285922050 * m + 0.4505937099 * s,
      0.0259040371 * l + 0.7827717662 * m - 0.8086757660 * s];
  }

  function fromOklab([L, A, B]) {
    const l = (L + 0.3963377774 * A + 0.2158037573 * B) ** 3;
    const m = (L - 0.1055613458 * A - 0.0638541728 * B) ** 3;
    const s = (L - 0.0894841775 * A - 1.2914855480 * B) ** 3;
    const lin = [4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s, -1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s,
      -0.0041960863 * l - 0.7034186147 * m + 1.7076147010 * s];
    return lin.map((c) => {
      const x = c <= 0.0031308 ? 12.92 * c : 1.055 * c ** (1 / 2.4) - 0.055;
      return Math.round(Math.min(1, Math.max(0, x)) * 255);
    });
  }

  const LO_LAB = toOklab(HM_LO);
  const HI_LAB = toOklab(HM_HI);

  /** The scale's colour at t in [0, 1] as #rrggbb: the light end at 0, the dark end at 1. */
  function scaleColour(t) {
    const rgb = fromOklab(LO_LAB.map((lo, i) => lo + (HI_LAB[i] - lo) * t));
    return `#${rgb.map((c) => c.toString(16).padStart(2, '0')).join('')}`;
  }

  /** The ink on a cell of colour t, as the page's .on-dark class draws it. */
  const inkOn = (t) => (t > ON_DARK_AT ? '#ffffff' : '#000000');

  /** A string as one POSIX shell word, in single quotes. */
  function shellQuote(s) {
    return `'${s.replace(/'/g, "'\\''")}'`;
  }

  globalThis.AttentionTrace ??= {};
  globalThis.AttentionTrace.format = Object.freeze({
    MINUS, fmt, pct, fmtSmall, fmtExp, int, quoted, subscript, fmtBase, extent, unit, norm, SCALE_MODES, AUTO_ROW_ABOVE, mapScale,
    HM_LO, HM_HI, ON_DARK_AT, toOklab, fromOklab, scaleColour, inkOn, shellQuote,
  });
})();
