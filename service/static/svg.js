/*
 * attention-trace viewer: the SVG exports, built from a trace's numbers. Pure: no DOM, no state.
 *
 * `node(tag, attrs, ...children)` makes a plain element tree; `toXml` writes it as XML, escaping every text and
 * attribute value (a token is user text: "<", "&" and quotes are written as entities, and characters XML 1.0
 * cannot hold become U+FFFD), so the file is well-formed whatever the sentence. The page saves `svgFile(root)`
 * through a Blob; it never parses it.
 *
 * The drawings: one attention map (heatmapSvg), the √d_k comparison (comparisonSvg), and labelled grids side by
 * side (gridsSvg: Q · Kᵀ = scores, every head's weights, a stack's residual stream, from the numbers the page draws).
 * A file is self-contained: a title with the configuration, the tokens on both axes, every cell's number (up to
 * 12 tokens; above that, colours, with each cell's exact value in its <title>), masked cells hatched and labelled,
 * a colour-scale legend; no font, image or style sheet, and no link.
 *
 * Adds `svg` to globalThis.AttentionTrace (after format.js and trace.js); tests/js/svg.test.js runs it under Node.
 */
'use strict';

(() => {
  const { fmt, pct, fmtBase, mapScale, scaleColour, inkOn } = globalThis.AttentionTrace.format;
  const { HEATMAP_MAX_TOKENS, CELL_NUMBERS_MAX_TOKENS, keyTokensOf, isCross } = globalThis.AttentionTrace.trace;

  const SVG_NS = 'http://www.w3.org/2000/svg'; // an XML namespace name, never fetched
  const SVG_FONT = 'system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, Arial, sans-serif';

  // ---------------------------------------------------------------- the element tree and its XML

  /** An element: attributes that are null or undefined are left out; children are nodes or text (nested arrays
   * are flattened; null, undefined and false are skipped). */
  function node(tag, attrs, ...kids) {
    const out = { tag, attrs: {}, kids: [] };
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) out.attrs[k] = String(v);
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      out.kids.push(typeof kid === 'object' ? kid : String(kid));
    }
    return out;
  }

  /** Append children to an element, as node() takes them. */
  function append(parent, ...kids) {
    parent.kids.push(...node('g', {}, ...kids).kids);
    return parent;
  }

  // XML 1.0's characters: no C0 control but tab, line feed and carriage return; no U+FFFE, U+FFFF or lone surrogate.
  const NOT_XML = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\uFFFE\uFFFF]|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
  const TEXT_ENTITIES = { '&': '&amp;', '<': '&lt;', '>': '&gt;' };
  // In an attribute, white space other than a space is written as a reference so that the parser keeps it.
  const ATTR_ENTITIES = { ...TEXT_ENTITIES, '"': '&quot;', '\t': '&#9;', '\n': '&#10;', '\r': '&#13;' };
  const escapeText = (s) => s.replace(NOT_XML, '\uFFFD').replace(/[&<>]/g, (c) => TEXT_ENTITIES[c]);
  const escapeAttr = (s) => s.replace(NOT_XML, '\uFFFD').replace(/[&<>"\t\n\r]/g, (c) => ATTR_ENTITIES[c]);

  /** The tree as XML text. */
  function toXml(n) {
    if (typeof n === 'string') return escapeText(n);
    const attrs = Object.entries(n.attrs).map(([k, v]) => ` ${k}="${escapeAttr(v)}"`).join('');
    if (!n.kids.length) return `<${n.tag}${attrs}/>`;
    return `<${n.tag}${attrs}>${n.kids.map(toXml).join('')}</${n.tag}>`;
  }

  /** The file's text: an XML declaration, the drawing, a final line break. */
  const svgFile = (root) => `<?xml version="1.0" encoding="UTF-8"?>\n${toXml(root)}\n`;

  // ---------------------------------------------------------------- shared parts

  /** Title lines of an export: what was traced (`sentence`: as typed; else the tokens, spaced), and how. */
  function configLines(doc, sentence = null) {
    const cfg = doc.config;
    const extras = [];
    if (cfg.positional_encoding === 'rope') extras.push(`RoPE ${cfg.rope_pairing}, base ${fmtBase(cfg.rope_base)}`);
    else extras.push(`positional encoding ${cfg.positional_encoding}`);
    if (cfg.num_kv_heads !== undefined) extras.push(`${cfg.num_kv_heads} K/V head${cfg.num_kv_heads === 1 ? '' : 's'}`);
    if (cfg.window !== undefined) extras.push(`window ${cfg.window}`);
    if (isCross(doc)) extras.push(`cross-attention to “${doc.context_tokens.map((t) => t.text).join(' ')}”`);
    const text = typeof sentence === 'string' ? sentence : doc.tokens.map((t) => t.text).join(' ');
    return [`“${text}”`,
      [`d_model ${cfg.d_model}`, `${cfg.num_heads} head${cfg.num_heads === 1 ? '' : 's'} of d_k ${cfg.d_k}`, `seed ${cfg.seed}`,
        cfg.scale ? `scaled ÷ √${cfg.d_k}` : 'not scaled (÷ 1)', cfg.causal ? 'causal' : null, ...extras,
        `engine ${doc.engine_version}`].filter(Boolean).join(' · ')];
  }

  const textWidth = (s, size = 12) => [...s].length * size * 0.62; // generous: no font is embedded

  function svgRoot(width, height, title, desc) {
    return node('svg', { xmlns: SVG_NS, width: Math.ceil(width), height: Math.ceil(height),
      viewBox: `0 0 ${Math.ceil(width)} ${Math.ceil(height)}`, 'font-family': SVG_FONT, 'font-size': 12, role: 'img' },
    node('title', {}, title), node('desc', {}, desc),
    node('rect', { x: 0, y: 0, width: '100%', height: '100%', fill: '#ffffff' }));
  }

  function hatch() {
    return node('pattern', { id: 'masked', width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
      node('rect', { width: 6, height: 6, fill: '#ffffff' }), node('rect', { width: 2, height: 6, fill: '#b8bfca' }));
  }

  /** The masked cells' hatch (url(#masked)) and the colour scale's gradient (url(#scale)). */
  function scaleDefs() {
    const stops = Array.from({ length: 11 }, (_, i) => node('stop', { offset: `${i * 10}%`, 'stop-color': scaleColour(i / 10) }));
    return node('defs', {}, hatch(), node('linearGradient', { id: 'scale', x1: 0, x2: 1, y1: 0, y2: 0 }, stops));
  }

  /** A drawing's first lines from the top left: its heading in bold, then the sentence and the configuration. */
  const headingLines = (lines) => lines.map((l, i) => node('text', { x: 24, y: 28 + i * 18, 'font-size': i ? 12 : 14,
    'font-weight': i ? 400 : 700, fill: i ? '#444b57' : '#16191f' }, l));

  /** Where the colour-scale bar of a legend whose low end reads `lo` starts. */
  const legendBarX = (lo) => 24 + textWidth('colour scale') + 12 + textWidth(lo) + 6;

  /** A legend's colour-scale bar at height `y`, its two ends labelled `lo` and `hi`. */
  function scaleLegend(y, lo, hi) {
    const barX = legendBarX(lo);
    return [node('text', { x: 24, y: y + 11 }, 'colour scale'),
      node('text', { x: barX - 6, y: y + 11, 'text-anchor': 'end' }, lo),
      node('rect', { x: barX, y, width: 140, height: 14, fill: 'url(#scale)', stroke: '#d7dbe2' }),
      node('text', { x: barX + 146, y: y + 11 }, hi)];
  }

  /** A legend's line for masked cells at height `y`: the hatch, and what masked means here. */
  const maskedLegend = (y, text) => [node('rect', { x: 24, y, width: 18, height: 14, fill: 'url(#masked)', stroke: '#9aa3b2' }),
    node('text', { x: 48, y: y + 11 }, text)];

  // ---------------------------------------------------------------- the drawings

  /**
   * One attention map as a stand-alone SVG: title and configuration, both token axes, every cell's number, legend.
   * `spec` is the page's map (stage, title, formula, matrix, tokens, keyTokens, kind, maskRow, showMasked, and
   * mode: the colour scale, format.js's mapScale, 'abs' by default); `doc` the trace it comes from, `head` the head
   * it shows, `sentence` the sentence as typed (the caption; the tokens, spaced, without it).
   */
  function heatmapSvg(spec, { doc, head, sentence = null }) {
    const { title, formula, matrix, tokens, kind, maskRow } = spec;
    const keyTokens = spec.keyTokens || tokens;
    const n = Math.min(matrix.length, HEATMAP_MAX_TOKENS);
    const m = Math.min(matrix[0]?.length ?? 0, HEATMAP_MAX_TOKENS);
    const numbers = Math.max(n, m) <= CELL_NUMBERS_MAX_TOKENS;
    const cw = numbers ? 60 : 16;
    const ch = numbers ? 32 : 16;
    const rows = tokens.slice(0, n).map((t) => t.text);
    const cols = keyTokens.slice(0, m).map((t) => t.text);
    const keyWord = spec.keyTokens ? 'context key' : 'key';
    const scale = mapScale(matrix.slice(0, n).map((r) => r.slice(0, m)), { kind, mode: spec.mode, isMasked: maskRow });
    // A constructed head names its job (engine/constructed.py's kinds, as the page writes them).
    const kind_ = Array.isArray(doc.config.head_weights) ? doc.config.head_weights[head] : undefined;
    const job = kind_ && kind_ !== 'seeded' ? ` (${String(kind_).replace(/_/g, '-')})` : '';
    const heading = `${title} · head ${head}${job} of ${doc.config.num_heads} · ${formula}`;
    const lines = [heading, ...configLines(doc, sentence)];
    const rowW = Math.min(180, Math.max(40, ...rows.map((r) => textWidth(r)))) + 12;
    // Column labels at 45° while the cells are wide; upright (90°) on narrow cells, one text line a column, so
    // that neighbours never overlap.
    const upright = !numbers;
    const labelSize = upright ? 11 : 12;
    const colH = Math.min(140, Math.max(30, ...cols.map((c) => textWidth(c, labelSize) * (upright ? 1 : 0.71)))) + 14;
    const left = 24 + 22 + rowW;
    const top = 20 + lines.length * 18 + 22 + colH;
    const gridW = m * cw;
    const gridH = n * ch;
    // The legend in the cells' unit: weights as fractions (as the cells are written), scores as they are.
    const { lo } = scale;
    const hi = scale.hi + (scale.mode === 'row' ? ' (each row on its own scale)' : '');
    const width = Math.max(left + gridW + 24, 48 + Math.max(...lines.map((l, i) => textWidth(l, i ? 12 : 14))), 380,
      legendBarX(lo) + 146 + textWidth(hi) + 24);
    const height = top + gridH + 84;
    const root = svgRoot(width, height, `${title}, head ${head}${job}: attention-trace`,
      `${lines.join('. ')}. Rows are queries, columns are ${keyWord}s; masked cells are hatched and labelled.`);
    append(root, scaleDefs(), ...headingLines(lines));
    append(root, node('text', { x: left + gridW / 2, y: 20 + lines.length * 18 + 14, 'text-anchor': 'middle', fill: '#444b57' },
      `${keyWord} →`));
    append(root, node('text', { x: 0, y: 0, 'text-anchor': 'middle', fill: '#444b57',
      transform: `translate(${24 + 8} ${top + gridH / 2}) rotate(-90)` }, 'query →'));
    const colLabels = node('g', { class: 'col-labels', 'font-weight': 600, 'font-size': labelSize },
      cols.map((c, j) => node('text', { x: 0, y: 0, 'data-col': j,
        transform: upright ? `translate(${left + j * cw + cw / 2 + labelSize * 0.35} ${top - 6}) rotate(-90)`
          : `translate(${left + j * cw + cw / 2 + 4} ${top - 6}) rotate(-45)` }, c)));
    const rowLabels = node('g', { class: 'row-labels', 'font-weight': 600, 'text-anchor': 'end' },
      rows.map((r, i) => node('text', { x: left - 8, y: top + i * ch + ch / 2 + 4, 'data-row': i }, r)));
    const cells = node('g', { class: 'cells', 'text-anchor': 'middle', 'font-size': 11 });
    for (let i = 0; i < n; i += 1) {
      for (let j = 0; j < m; j += 1) {
        const v = matrix[i][j];
        const off = v === null || (maskRow && maskRow(i, j));
        const x = left + j * cw;
        const y = top + i * ch;
        const t = off ? 0 : scale.t(i, v);
        const exact = off ? 'masked' : kind === 'weight' ? `${fmt(v, 4)} (${pct(v, 2)})` : fmt(v, 4);
        append(cells, node('g', { 'data-row': i, 'data-col': j, 'data-value': v === null ? 'null' : String(v) },
          node('title', {}, `query “${rows[i]}” → ${keyWord} “${cols[j]}”: ${exact}`),
          node('rect', { x: x + 1, y: y + 1, width: cw - 2, height: ch - 2, rx: 2,
            fill: off ? 'url(#masked)' : scaleColour(t), stroke: off ? '#9aa3b2' : 'none' }),
          numbers ? node('text', { x: x + cw / 2, y: y + ch / 2 + 4, fill: off ? '#444b57' : inkOn(t),
            'font-style': off ? 'italic' : null }, off ? 'masked' : fmt(v, 2)) : null));
      }
    }
    const ly = top + gridH + 30;
    const legendG = node('g', { class: 'legend', fill: '#444b57', 'data-mode': scale.mode }, scaleLegend(ly, lo, hi));
    if (spec.showMasked || spec.maskRow) {
      append(legendG, ...maskedLegend(ly + 24, kind === 'weight' ? 'masked: excluded from the softmax (weight 0)' : 'masked: set to −∞'));
    }
    return append(root, colLabels, rowLabels, cells, legendG);
  }

  /**
   * The saturation comparison as SVG: the query's weights with the scores divided by √d_k and without, per key;
   * entropy and max weight. `main` is the trace on screen, `alt` the same request with scale flipped.
   */
  function comparisonSvg(main, alt, { query: q, head: hd, sentence = null }) {
    const scaled = main.config.scale ? main : alt;
    const unscaled = main.config.scale ? alt : main;
    const keys = keyTokensOf(scaled).map((t) => t.text);
    const masked = scaled.stages.masked_scores ? scaled.stages.masked_scores.values[hd][q] : null;
    const series = [
      { name: `scaled (÷ √${scaled.config.d_k} = ${fmt(scaled.config.scale_factor, 3)})`, doc: scaled, fill: scaleColour(1) },
      { name: 'unscaled (÷ 1)', doc: unscaled, fill: scaleColour(0.45) },
    ];
    const lines = [`Why divide by √d_k: the weights of “${scaled.tokens[q].text}” (query ${q}), head ${hd}`,
      ...configLines(scaled, sentence).map((l) => l.replace(/ · scaled ÷ √\d+| · not scaled \(÷ 1\)/, ''))];
    const labelW = Math.min(180, Math.max(40, ...keys.map((k) => textWidth(k)))) + 12;
    const left = 24 + labelW;
    const barW = 320;
    const rowH = 40;
    const top = 20 + lines.length * 18 + 36;
    const width = Math.max(left + barW + 90, 48 + Math.max(...lines.map((l, i) => textWidth(l, i ? 12 : 14))));
    const height = top + keys.length * rowH + 80;
    const root = svgRoot(width, height, `Scaled and unscaled weights of “${scaled.tokens[q].text}”: attention-trace`,
      `${lines.join('. ')}. For each key, the weight with the scores divided by √d_k and without.`);
    append(root, node('defs', {}, hatch()), ...headingLines(lines));
    const legendY = 20 + lines.length * 18 + 10;
    series.forEach((s, k) => append(root, node('rect', { x: 24 + k * 220, y: legendY, width: 14, height: 12, fill: s.fill }),
      node('text', { x: 44 + k * 220, y: legendY + 10, fill: '#444b57' }, s.name)));
    const bars = node('g', { class: 'bars' });
    keys.forEach((key, j) => {
      const y = top + j * rowH;
      const off = masked && masked[j] === null;
      append(bars, node('text', { x: left - 8, y: y + rowH / 2 + 4, 'text-anchor': 'end', 'font-weight': 600, 'data-key': j }, key));
      series.forEach((s, k) => {
        const w = s.doc.stages.weights.values[hd][q][j];
        const by = y + 3 + k * 17;
        append(bars, node('g', { 'data-key': j, 'data-series': k ? 'unscaled' : 'scaled' },
          off ? node('rect', { x: left, y: by, width: 40, height: 14, fill: 'url(#masked)', stroke: '#9aa3b2' })
            : node('rect', { x: left, y: by, width: Math.max(0.5, w * barW), height: 14, fill: s.fill }),
          node('text', { x: left + (off ? 46 : Math.max(0.5, w * barW) + 6), y: by + 11, 'font-size': 11,
            'font-style': off ? 'italic' : null }, off ? 'masked' : pct(w))));
      });
    });
    const sy = top + keys.length * rowH + 24;
    const stats = node('g', { class: 'stats', fill: '#16191f' },
      series.map((s, k) => node('text', { x: 24, y: sy + k * 18 },
        `${k ? 'unscaled' : 'scaled'}: entropy ${fmt(s.doc.stats.entropy[hd][q], 3)} nats · max weight ${pct(s.doc.stats.max_weight[hd][q])}`)));
    return append(root, bars, stats);
  }

  /**
   * Labelled grids side by side as one stand-alone SVG: Q · Kᵀ = scores, every head's weights, a stack's residual
   * stream. The page hands over what it draws (so the file holds the numbers on screen): `heading` the figure's
   * title (the section's, as on screen), `label` the file's <title>; `grids`, each {caption, rows, cols, cells,
   * queryRow, markCol}: cells[i][j] is {t, text, title} (t: the cell's place on its colour scale, 0 … 1, or null: masked;
   * text: the number written on it, '' for none; title: its exact value, in words), the query's row (queryRow)
   * outlined, a column (markCol) outlined dashed; `ops[k]` a symbol drawn between
   * grid k and k + 1; `perRow` grids on one line; `legend` {lo, hi} a colour-scale bar, or null; `notes` lines
   * under the grids. Under the heading: the sentence and the configuration (configLines).
   */
  function gridsSvg({ heading, label, doc, sentence = null, grids, ops = [], perRow = grids.length, legend = null, notes = [],
    desc = '' }) {
    const lines = [heading, ...configLines(doc, sentence)];
    const hasMasked = grids.some((g) => g.cells.some((r) => r.some((c) => c.t === null)));
    const placed = grids.map((g) => {
      const n = g.rows.length;
      const m = g.cols.length;
      const longest = Math.max(0, ...g.cells.flat().map((c) => textWidth(c.text || '', 11)));
      const numbers = longest > 0;
      const cw = numbers ? Math.max(40, longest + 12) : 14;
      const ch = numbers ? 24 : 14;
      const upright = cw < 30;
      const labelSize = upright ? 10 : 11;
      const rowW = Math.min(140, Math.max(16, ...g.rows.map((r) => textWidth(r, 11)))) + 8;
      const colH = Math.min(120, Math.max(12, ...g.cols.map((c) => textWidth(c, labelSize) * (upright ? 1 : 0.71)))) + 10;
      const w = Math.max(rowW + m * cw, textWidth(g.caption, 12) + 4);
      return { g, n, m, cw, ch, upright, labelSize, rowW, colH, w, h: 20 + colH + n * ch };
    });
    // Lines of `perRow` grids, each grid's place on the page.
    const top0 = 20 + lines.length * 18 + 14;
    let y = top0;
    let widest = 0;
    for (let k = 0; k < placed.length; k += perRow) {
      const line = placed.slice(k, k + perRow);
      let x = 24;
      line.forEach((p, i) => {
        Object.assign(p, { x, y });
        x += p.w + (ops[k + i] ? 40 : 28);
      });
      widest = Math.max(widest, x);
      y += Math.max(...line.map((p) => p.h)) + 24;
    }
    const legendY = y;
    const notesY = legendY + (legend || hasMasked ? 24 + (legend && hasMasked ? 22 : 0) : 0);
    const width = Math.max(widest, 48 + Math.max(...lines.map((l, i) => textWidth(l, i ? 12 : 14)),
      ...notes.map((l) => textWidth(l))), legend ? 24 + textWidth('colour scale') + 200 + textWidth(legend.lo) + textWidth(legend.hi) : 0, 380);
    const height = notesY + notes.length * 18 + 24;
    const root = svgRoot(width, height, label, `${lines.join('. ')}.${desc ? ` ${desc}` : ''}`);
    append(root, scaleDefs(), ...headingLines(lines));
    placed.forEach((p, k) => {
      const { g, x, cw, ch, upright, labelSize, rowW, colH } = p;
      const left = x + rowW;
      const top = p.y + 20 + colH;
      const out = node('g', { class: 'grid', 'data-grid': k },
        node('text', { x, y: p.y + 12, 'font-weight': 700, fill: '#16191f' }, g.caption),
        node('g', { class: 'col-labels', 'font-weight': 600, 'font-size': labelSize },
          g.cols.map((c, j) => node('text', { x: 0, y: 0, 'data-col': j,
            transform: upright ? `translate(${left + j * cw + cw / 2 + labelSize * 0.35} ${top - 5}) rotate(-90)`
              : `translate(${left + j * cw + cw / 2 + 4} ${top - 5}) rotate(-45)` }, c))),
        node('g', { class: 'row-labels', 'font-size': 11, 'text-anchor': 'end' },
          g.rows.map((r, i) => node('text', { x: left - 6, y: top + i * ch + ch / 2 + 4, 'data-row': i,
            'font-weight': i === g.queryRow ? 700 : 400 }, i === g.queryRow ? `▸ ${r}` : r))));
      const cells = node('g', { class: 'cells', 'text-anchor': 'middle', 'font-size': 11 });
      g.cells.forEach((r, i) => r.forEach((c, j) => {
        const off = c.t === null;
        const cx = left + j * cw;
        const cy = top + i * ch;
        append(cells, node('g', { 'data-row': i, 'data-col': j },
          node('title', {}, c.title),
          node('rect', { x: cx + 0.5, y: cy + 0.5, width: cw - 1, height: ch - 1,
            fill: off ? 'url(#masked)' : scaleColour(c.t), stroke: off ? '#9aa3b2' : 'none' }),
          c.text ? node('text', { x: cx + cw / 2, y: cy + ch / 2 + 4, fill: off ? '#444b57' : inkOn(c.t) }, c.text) : null));
      }));
      append(out, cells);
      if (g.queryRow !== null && g.queryRow !== undefined && g.queryRow < p.n) {
        append(out, node('rect', { class: 'query-row', x: left, y: top + g.queryRow * ch, width: p.m * cw, height: ch,
          fill: 'none', stroke: '#16191f', 'stroke-width': 1.5 }));
      }
      if (Number.isInteger(g.markCol) && g.markCol >= 0 && g.markCol < p.m) {
        append(out, node('rect', { class: 'marked-col', x: left + g.markCol * cw, y: top, width: cw, height: p.n * ch,
          fill: 'none', stroke: '#16191f', 'stroke-width': 1.5, 'stroke-dasharray': '4 3' }));
      }
      if (ops[k] && k + 1 < placed.length && (k + 1) % perRow !== 0) {
        append(out, node('text', { x: x + p.w + 20, y: top + (p.n * ch) / 2 + 6, 'text-anchor': 'middle', 'font-size': 20,
          fill: '#16191f' }, ops[k]));
      }
      append(root, out);
    });
    const legendG = node('g', { class: 'legend', fill: '#444b57' });
    if (legend) append(legendG, ...scaleLegend(legendY, legend.lo, legend.hi));
    if (hasMasked) append(legendG, ...maskedLegend(legendY + (legend ? 22 : 0), 'masked: excluded from the softmax (weight 0)'));
    append(root, legendG);
    append(root, node('g', { class: 'notes', fill: '#16191f' },
      notes.map((l, i) => node('text', { x: 24, y: notesY + 12 + i * 18 }, l))));
    return root;
  }

  globalThis.AttentionTrace.svg = Object.freeze({
    SVG_NS, node, append, toXml, svgFile, configLines, textWidth, heatmapSvg, comparisonSvg, gridsSvg,
  });
})();
