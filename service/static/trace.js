/*
 * attention-trace viewer: reading a /trace answer. Pure: no DOM, no state.
 *
 * The tokens along the key axis (the context's, in cross-attention), the K/V head a query head reads (grouped-query
 * attention), how much of a long trace the page draws, and the file name of an export (service/standalone.py
 * names the HTML file alike, export_filename).
 *
 * Adds `trace` to globalThis.AttentionTrace; tests/js/trace.test.js runs it under Node.
 */
'use strict';

(() => {
  /** More tokens than this: the maps draw the first 48 only (the JSON download has them all). */
  const HEATMAP_MAX_TOKENS = 48;
  /** More tokens than this: cells show colour only; the readout (and the SVG's <title>) has the value. */
  const CELL_NUMBERS_MAX_TOKENS = 12;

  /** The tokens along the key axis: the context's in cross-attention, else the sentence's. */
  const keyTokensOf = (doc) => doc.context_tokens || doc.tokens;
  const isCross = (doc) => Array.isArray(doc.context_tokens);

  /** Which K/V head query head `hd` reads (itself, without GQA). */
  function kvHeadOf(cfg, hd) {
    const groups = cfg.query_heads_of_kv_head;
    if (!groups) return hd;
    const g = groups.findIndex((heads) => heads.includes(hd));
    return g < 0 ? 0 : g;
  }

  /**
   * The file name (without extension) of an export of a trace:
   * attention-trace_<sentence>_d<d_model>_h<heads>_seed<seed>[_unscaled][_causal][_rope][_kv…][_w…][_cross][_decode].
   */
  function exportName(doc, body) {
    const cfg = doc.config;
    const text = typeof body.sentence === 'string' ? body.sentence : doc.tokens.map((t) => t.text).join(' ');
    const slug = text.trim().toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '').slice(0, 40) || 'trace';
    const variant = [cfg.positional_encoding === 'rope' ? '_rope' : '', cfg.num_kv_heads !== undefined ? `_kv${cfg.num_kv_heads}` : '',
      cfg.window !== undefined ? `_w${cfg.window}` : '', isCross(doc) ? '_cross' : '', cfg.decode ? '_decode' : ''].join('');
    return `attention-trace_${slug}_d${cfg.d_model}_h${cfg.num_heads}_seed${cfg.seed}${cfg.scale ? '' : '_unscaled'}`
      + `${cfg.causal ? '_causal' : ''}${variant}`;
  }

  globalThis.AttentionTrace ??= {};
  globalThis.AttentionTrace.trace = Object.freeze({
    HEATMAP_MAX_TOKENS, CELL_NUMBERS_MAX_TOKENS, keyTokensOf, isCross, kvHeadOf, exportName,
  });
})();
