/*
 * attention-trace viewer: one cell, number by number, from a trace alone. Pure: no DOM, no state.
 *
 * explainCell(doc, head, query, key) is POST /explain's answer (engine/explain.py, explain_cell) computed from a
 * /trace answer's own numbers, so that a saved page, which has no service to ask, explains a clicked cell with the
 * very code (explain.js) that draws the live answer. The same steps, formulas and notes, word for word; the same
 * numbers:
 *   - every number that is an entry of a stage (q, k or the rotated ones, v, the score, the scaled score, the row's
 *     maximum, the weight, the context row) is read from the trace, so it is the service's, bit for bit;
 *   - the products and the in-order sums are the same IEEE operations in the same order, bit for bit too;
 *   - the exponentials come from the browser's Math.exp, which may differ from numpy's exp in the last bit (about
 *     one value in ten, by one unit in the last place), and so may the denominator (numpy's pairwise sum, below,
 *     over those terms). Shown to 4 decimals (or 4 significant digits), they read the same.
 *
 * Adds `cell` to globalThis.AttentionTrace (after format.js and trace.js); tests/js/cell.test.js runs it under Node,
 * and tests/test_viewer_js.py compares it with the service's /explain.
 */
'use strict';

(() => {
  const { keyTokensOf, isCross, kvHeadOf } = globalThis.AttentionTrace.trace;

  // ---------------------------------------------------------------- Python's spellings (the notes are the engine's)

  const NOT_PRINTABLE = /[\p{C}\p{Z}]/u; // str.isprintable's exceptions: other (Cc, Cf, Cs, Co, Cn) and separators

  /** repr(s) as Python writes it: single quotes unless the text has one and no double quote; escapes. */
  function pyRepr(s) {
    const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
    const hex = (c, width) => c.toString(16).padStart(width, '0');
    let out = '';
    for (const ch of s) {
      const c = ch.codePointAt(0);
      if (ch === quote || ch === '\\') out += `\\${ch}`;
      else if (ch === '\t') out += '\\t';
      else if (ch === '\n') out += '\\n';
      else if (ch === '\r') out += '\\r';
      else if (ch !== ' ' && (c < 0x20 || c === 0x7f || NOT_PRINTABLE.test(ch))) {
        out += c <= 0xff ? `\\x${hex(c, 2)}` : c <= 0xffff ? `\\u${hex(c, 4)}` : `\\U${hex(c, 8)}`;
      } else out += ch;
    }
    return quote + out + quote;
  }

  /** repr(x) of a Python float: the shortest digits that read back as x, "2.0" for 2, "1e-05" below 1e-4. */
  function pyFloat(x) {
    if (!Number.isFinite(x)) return Number.isNaN(x) ? 'nan' : x > 0 ? 'inf' : '-inf';
    if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
    const [mantissa, power] = x.toExponential().split('e'); // the shortest digits, as repr's
    const exp = Number(power);
    const digits = mantissa.replace('-', '').replace('.', '');
    const sign = x < 0 ? '-' : '';
    if (exp < -4 || exp >= 16) {
      const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
      return `${sign}${m}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
    }
    if (exp < 0) return `${sign}0.${'0'.repeat(-exp - 1)}${digits}`;
    return `${sign}${digits.slice(0, exp + 1).padEnd(exp + 1, '0')}.${digits.slice(exp + 1) || '0'}`;
  }

  /** A Python list of ints as repr writes it: [2, 3]. */
  const pyList = (xs) => `[${xs.join(', ')}]`;

  // ---------------------------------------------------------------- sums, as numpy and the engine add

  /** numpy's sum of a float64 row (pairwise_sum: 8 running sums in blocks of up to 128, halves above that). */
  function pairwiseSum(a, lo = 0, n = a.length) {
    if (n < 8) {
      let res = 0;
      for (let i = lo; i < lo + n; i += 1) res += a[i];
      return res;
    }
    if (n <= 128) {
      const r = a.slice(lo, lo + 8);
      let i = 8;
      for (; i < n - (n % 8); i += 8) for (let j = 0; j < 8; j += 1) r[j] += a[lo + i + j];
      let res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
      for (; i < n; i += 1) res += a[lo + i];
      return res;
    }
    let n2 = Math.floor(n / 2);
    n2 -= n2 % 8;
    return pairwiseSum(a, lo, n2) + pairwiseSum(a, lo + n2, n - n2);
  }

  /** terms[0] + terms[1] + …, one addition at a time in order (engine/explain.py, sum_in_order); vectors too. */
  function sumInOrder(terms) {
    let total = terms[0];
    for (const t of terms.slice(1)) total = Array.isArray(total) ? total.map((x, d) => x + t[d]) : total + t;
    return total;
  }

  // ---------------------------------------------------------------- the cell

  /** Why key j is hidden from query i (engine/explain.py, mask_reason). */
  function maskReason(cfg, query, key, queryText, keyText) {
    if (key > query) {
      return `causal mask: key ${key} ${pyRepr(keyText)} comes after query ${query} ${pyRepr(queryText)} (key > query), `
        + 'and a token may not attend to later tokens';
    }
    const w = cfg.window;
    const back = query - key;
    return `sliding window of ${w}: key ${key} ${pyRepr(keyText)} is ${back} position${back !== 1 ? 's' : ''} before `
      + `query ${query} ${pyRepr(queryText)}, and a query sees only its own key and the ${w - 1} before it `
      + '(query − key ≥ window)';
  }

  /** The query's KV-cache decoding step against the cell (engine/explain.py, decode_cell). */
  function decodeCell(steps, head, query, key, { score, weight }) {
    const s = steps[query];
    const cached = s.cache_positions;
    const doc = { position: query, cache_positions: cached, in_cache: cached.includes(key) };
    if (doc.in_cache) {
      const c = cached.indexOf(key);
      const dScore = s.scores[head][c];
      const dWeight = s.weights[head][c];
      return { ...doc, cache_index: c, score: dScore, scaled: s.scaled_scores[head][c], weight: dWeight,
        score_difference: Math.abs(dScore - score), weight_difference: Math.abs(dWeight - weight),
        note: `step ${query} scores its new query against the ${cached.length} cached keys; key ${key} is `
          + `entry ${c} of the cache` };
    }
    const why = key > query ? 'is not generated yet' : "has left the sliding window's cache";
    return { ...doc, cache_index: null, score: null, scaled: null, weight: null, score_difference: null,
      weight_difference: null,
      note: `key ${key} ${why} at step ${query}: the cache holds positions ${cached[0]} … ${cached[cached.length - 1]}, `
        + 'so no mask is needed' };
  }

  /**
   * POST /explain's answer for head, query and key (0-based) of a /trace answer `doc` (with every stage the page
   * draws): the same members and the same eight steps.
   */
  function explainCell(doc, head, query, key) {
    const cfg = doc.config;
    const S = doc.stages;
    const keyTokens = keyTokensOf(doc);
    const cross = isCross(doc);
    const m = keyTokens.length;
    const kvHead = kvHeadOf(cfg, head);
    const kvHeads = cfg.num_kv_heads ?? cfg.num_heads;
    const groupSize = cfg.num_heads / kvHeads;
    const rope = cfg.positional_encoding === 'rope';
    const [qStage, kStage] = rope ? ['q_rotated', 'k_rotated'] : ['q', 'k'];
    const [qLabel, kLabel] = rope ? ['RoPE(q)', 'RoPE(k)'] : ['q', 'k'];
    const qt = doc.tokens[query].text;
    const kt = keyTokens[key].text;
    const keyTexts = keyTokens.map((t) => t.text);
    const dk = cfg.d_k;

    const qVec = S[qStage].values[head][query];
    const kVec = S[kStage].values[kvHead][key];
    const prods = qVec.map((x, i) => x * kVec[i]);
    const prodSum = sumInOrder(prods);
    const score = S.scores.values[head][query][key];
    const divisor = cfg.scale_factor;
    const scaled = S.scaled_scores.values[head][query][key];

    const maskedRow = S.masked_scores ? S.masked_scores.values[head][query] : null; // null entries: masked
    const rowMask = keyTokens.map((_, j) => maskedRow !== null && maskedRow[j] === null);
    const masked = rowMask[key];
    // The softmax's inner numbers (engine/attention.py, softmax_parts): the row's max over the unmasked keys (0
    // when every key is masked), exp(score − max), and numpy's sum of them.
    const scaledRow = S.scaled_scores.values[head][query];
    const source = maskedRow ?? scaledRow;
    const visibleScores = source.filter((v, j) => !rowMask[j]);
    const rowMax = visibleScores.length ? Math.max(...visibleScores) : 0;
    const maxKey = scaledRow.findIndex((v, j) => !rowMask[j] && v === rowMax);
    const terms = source.map((v, j) => (rowMask[j] ? 0 : Math.exp(v - rowMax)));
    const expValue = terms[key];
    const denominator = pairwiseSum(terms);
    const weight = S.weights.values[head][query][key];
    const weightsRow = S.weights.values[head][query];

    const vRows = S.v.values[kvHead];
    const contrib = vRows.map((v, j) => v.map((x) => weightsRow[j] * x));
    const contribSum = sumInOrder(contrib.filter((_, j) => !rowMask[j]));
    const context = S.context.values[head][query];
    const exponent = masked ? null : scaled - rowMax;
    const expRecomputed = exponent === null ? null : Math.exp(exponent);
    const denomRecomputed = sumInOrder(terms.filter((_, j) => !rowMask[j]));
    const weightRecomputed = expValue / denominator;

    const grouped = kvHeads !== cfg.num_heads;
    const kvNote = grouped ? `; query head ${head} reads K/V head ${kvHead} = ⌊${head} / ${groupSize}⌋ `
      + `(${kvHeads} K/V heads shared by ${cfg.num_heads} query heads)` : '';
    const ropeNote = rope ? '; under RoPE the rotated q and k are dotted' : '';
    const crossNote = cross ? '; the key is a context token (cross-attention)' : '';
    const [divisorText, scaleNote] = cfg.scale
      ? ['√d_k', `divided by the trace's scale factor √d_k = √${dk} = ${pyFloat(divisor)}`]
      : ['1 (scaling off)', 'scaling is off: divided by 1, the score is unchanged'];
    const hasMask = maskedRow !== null;
    const maskedKeys = rowMask.flatMap((off, j) => (off ? [j] : []));
    const reason = masked ? maskReason(cfg, query, key, qt, kt) : null;
    const maskedNote = masked ? `masked (${reason}): excluded from the softmax, exp(−∞) = 0` : null;

    const steps = [
      { id: 'products', stage: qStage, formula: `${qLabel}_${qt}[m] · ${kLabel}_${kt}[m] for m = 0 … ${dk - 1}`,
        value: null, values: prods, index: [head, query], q: qVec, k: kVec, k_stage: kStage, k_index: [kvHead, key],
        note: `d_k = ${dk} products of the query's and the key's coordinates${kvNote}${ropeNote}${crossNote}` },
      { id: 'score', stage: 'scores', formula: `scores[${head}, ${query}, ${key}] = Σₘ ${qLabel}_${qt}[m]·${kLabel}_${kt}[m]`,
        value: score, index: [head, query, key], recomputed: prodSum, exact: prodSum === score,
        note: 'recomputed: the products added one by one in order; the trace\'s score is BLAS\'s matrix '
          + 'product, which may fuse multiply–adds and sum in another order, so the last bits can differ'
          + (masked ? '; masked cells keep their score (the mask acts in the softmax)' : '') },
      { id: 'scaled', stage: 'scaled_scores', formula: `scaled = score / ${divisorText}`, value: scaled,
        index: [head, query, key], divisor, recomputed: score / divisor, exact: score / divisor === scaled,
        note: scaleNote },
      { id: 'row_max', stage: hasMask ? 'masked_scores' : 'scaled_scores',
        formula: `max over the ${hasMask ? 'unmasked ' : ''}keys of row ${query} (${pyRepr(qt)}) of the scaled scores`,
        value: rowMax, index: [head, query, maxKey], key: maxKey, key_token: keyTexts[maxKey],
        note: `subtracted before exp so that the largest exponent is exp(0) = 1; key ${maxKey} `
          + `${pyRepr(keyTexts[maxKey])} holds it${maskedKeys.length ? `; masked keys ${pyList(maskedKeys)} do not count` : ''}` },
      { id: 'exp', stage: 'weights', formula: 'exp(scaled − row_max)', value: expValue, index: [head, query, key],
        exponent, recomputed: expRecomputed, exact: expRecomputed === null ? null : expRecomputed === expValue,
        note: maskedNote || 'inside the softmax (step 9); recomputed: numpy\'s exp of this one number, '
          + 'which may differ in the last bit from the vectorised exp over the array' },
      { id: 'denominator', stage: 'weights',
        formula: `Σⱼ exp(scaled_j − row_max) over the ${m} key${m !== 1 ? 's' : ''} of row ${query}`,
        value: denominator, values: terms, index: [head, query], recomputed: denomRecomputed,
        exact: denomRecomputed === denominator,
        note: 'values: every key\'s exponential (0 for a masked key); value: numpy\'s sum of the row, '
          + 'recomputed: the same terms added in key order' },
      { id: 'weight', stage: 'weights', formula: `weights[${head}, ${query}, ${key}] = exp / denominator`,
        value: weight, index: [head, query, key], recomputed: weightRecomputed, exact: weightRecomputed === weight,
        note: maskedNote || `the share of key ${pyRepr(kt)} in the attention of query ${pyRepr(qt)}; `
          + 'the row\'s weights sum to 1' },
      { id: 'contributions', stage: 'context',
        formula: `weight_j · v_j for every key j; context[${head}, ${query}] = Σⱼ weight_j · v_j`, value: null,
        values: contrib.map((c, j) => (rowMask[j] ? null : c)), index: [head, query], weights: weightsRow,
        v: vRows, v_stage: 'v', v_index: [kvHead], vector: context, recomputed: contribSum,
        exact: contribSum.every((x, d) => x === context[d]),
        max_abs_difference: Math.max(...contribSum.map((x, d) => Math.abs(x - context[d]))),
        note: 'vector: the trace\'s context row (BLAS\'s weights·V); recomputed: the contributions added in key '
          + `order${maskedKeys.length ? `; masked keys ${pyList(maskedKeys)} contribute nothing (null)` : ''}` },
    ];
    const out = {
      schema_version: doc.schema_version, engine_version: doc.engine_version, config: cfg,
      parameters_digest: doc.parameters_digest,
      head, kv_head: kvHead, query, key, query_token: qt, key_token: kt, key_tokens: keyTexts,
      key_source: cross ? 'context_tokens' : 'tokens', d_k: dk, scale: cfg.scale, scale_factor: divisor,
      masked, mask_reason: reason, masked_keys: maskedKeys, steps,
    };
    if (Array.isArray(doc.decode)) out.decode = decodeCell(doc.decode, head, query, key, { score, weight });
    if (Number.isInteger(doc.layer)) out.layer = doc.layer; // one layer of a stack (trace.js, layerView), as the engine says
    return out;
  }

  globalThis.AttentionTrace.cell = Object.freeze({
    pyRepr, pyFloat, pyList, pairwiseSum, sumInOrder, maskReason, decodeCell, explainCell,
  });
})();
