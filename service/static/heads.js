/*
 * attention-trace viewer: interpretable heads. Pure: no DOM, no state.
 *
 * Seeded weights make noise-like patterns; a constructed head (docs/engine.md, "Constructed heads") has a known job,
 * so its map means something. Here: the kinds' names as the page writes them, one caption per kind, and the
 * presets: one click sets a configuration and a sentence that shows one job clearly, with a caption that says what
 * the audience should see. A preset is a set of fields (url-state.js), so the address carries it like any other
 * view, and a trace made with a preset's request (a reload, a saved page) shows that preset's caption again.
 *
 * Adds `heads` to globalThis.AttentionTrace (after url-state.js); tests/js/heads.test.js runs it under Node.
 */
'use strict';

(() => {
  const { DEFAULT_FIELDS, requestFrom, headKinds } = globalThis.AttentionTrace.urlState;

  /** A kind as the page writes it: previous_token is "previous-token". */
  const kindLabel = (kind) => String(kind).replace(/_/g, '-');

  /** A head's name on the page: "head 0", or "head 0 · previous-token" for a constructed head. */
  function headName(cfg, head) {
    const kind = Array.isArray(cfg?.head_weights) ? cfg.head_weights[head] : undefined;
    return kind && kind !== 'seeded' ? `head ${head} · ${kindLabel(kind)}` : `head ${head}`;
  }

  /** What each kind's map shows, for a configuration that is not a preset's (a head the user chose). */
  const KIND_CAPTIONS = Object.freeze({
    seeded: 'seeded (random) weights: no job, so its pattern is noise.',
    previous_token: 'each row\'s bright cell sits just left of the diagonal: each word looks at the word before it.',
    same_token: 'a repeated word looks back at its earlier copy; a word seen for the first time looks at itself.',
    first_token: 'every row looks at the first token (an attention sink): the first column is bright.',
    induction: 'layer 0 looks at the previous word and writes it into the residual stream; in layer 1, on '
      + '"… A B … A" the last A looks at the B after the first A, and its output copies B; a word with no earlier '
      + 'copy looks at the first token (an attention sink).',
  });

  const SENTENCE = 'the cat sat on the mat and the cat ran';

  /**
   * The presets, in the order the page offers them: `fields` over DEFAULT_FIELDS (the whole form: nothing of the
   * view before stays), the view to open on (`select`: query token, head, layer), and the caption. Sizes within the
   * constructions' limits: d_model ≥ 30 (≥ 43 with induction), d_k ≥ 16 previous-token, 28 same-token, 20
   * induction, 8 first-token; same-token reads earlier copies under the causal mask; induction needs two layers.
   * A second, seeded head beside the constructed one shows what the same map looks like without a job.
   */
  const PRESETS = Object.freeze([
    {
      id: 'previous_token', label: 'Previous token',
      fields: { sentence: SENTENCE, d_model: '64', num_heads: '2', causal: true, head_weights: 'previous_token,seeded' },
      select: { query: 2, head: 0, layer: null },
      caption: 'Head 0 is a previous-token head: in each row the bright cell sits just left of the diagonal, so each '
        + 'word looks at the word before it ("sat" looks at "cat", "ran" at "cat"). The first word has nothing before '
        + 'it and looks at itself. Head 1 keeps its seeded, random weights, for contrast: no pattern.',
    },
    {
      id: 'same_token', label: 'Same token',
      fields: { sentence: SENTENCE, d_model: '64', num_heads: '2', causal: true, head_weights: 'same_token,seeded' },
      select: { query: 8, head: 0, layer: null },
      caption: 'Head 0 is a same-token head: a repeated word looks back at its earlier copy. The second "cat" looks at '
        + 'the first "cat", and the second and third "the" at the first "the"; a word seen for the first time looks at '
        + 'itself, on the diagonal. Head 1 keeps its seeded weights, for contrast.',
    },
    {
      id: 'first_token', label: 'First token',
      fields: { sentence: SENTENCE, d_model: '64', num_heads: '2', causal: true, head_weights: 'first_token,seeded' },
      select: { query: 5, head: 0, layer: null },
      caption: 'Head 0 is a first-token head: every row looks at the first token, "the", so the whole first column is '
        + 'bright. Trained models have such heads, an attention sink: a place to put attention when nothing else '
        + 'matters. Head 1 keeps its seeded weights, for contrast.',
    },
    {
      id: 'induction', label: 'Induction (2 layers)',
      fields: { sentence: 'harry potter went to the shop and then harry', d_model: '128', num_heads: '1', causal: true,
        block: 'gpt2', num_layers: '2', head_weights: 'induction' },
      select: { query: 8, head: 0, layer: 1 },
      caption: 'An induction head, in two GPT-2 layers. Layer 0 is a previous-token head: it writes each word\'s '
        + 'previous word into the residual stream. Layer 1 (shown) matches the query against it: on "harry potter … '
        + 'harry" the last "harry" looks at "potter", the word after the first "harry", and its output copies '
        + '"potter": the guess that "potter" comes next. Every other word has no earlier copy, so it has nothing to '
        + 'copy and looks at the first token instead, an attention sink, as trained induction heads do: the first '
        + 'column is bright. Pick layer 0 to see the previous-token step.',
    },
    {
      id: 'mixed', label: 'Three jobs at once',
      fields: { sentence: SENTENCE, d_model: '128', num_heads: '4', causal: true,
        head_weights: 'previous_token,same_token,first_token,seeded' },
      select: { query: 8, head: 0, layer: null },
      caption: 'Four heads, one sentence: head 0 looks at the previous word (just left of the diagonal), head 1 at an '
        + 'earlier copy of the same word (the second "cat" at the first), head 2 at the first token (the first '
        + 'column), and head 3 keeps its seeded weights (noise). Pick a head, or compare them side by side below.',
    },
  ].map((p) => Object.freeze({ ...p, fields: Object.freeze({ ...DEFAULT_FIELDS, ...p.fields }) })));

  /** The request a preset sends (url-state.js, requestFrom). */
  const presetBody = (preset) => requestFrom(preset.fields).body;

  /**
   * The preset whose request `body` is (the same fields, in any order), or null. With the trace's config `cfg`, also
   * a request that names fewer fields but makes the same trace (the command line's `--html` sends only the options
   * given: no seed, no scale, the causal mask from the block): each field it names is one of the preset's, and the
   * config holds the preset's value for every field the preset sends.
   */
  function presetOf(body, cfg = null) {
    const same = (a, b) => JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
    const exact = PRESETS.find((p) => same(presetBody(p), body));
    if (exact || !cfg || !body || typeof body !== 'object') return exact ?? null;
    const made = (p) => {
      const want = presetBody(p);
      if (!Object.keys(body).every((k) => k in want && (k === 'sentence' || same(body[k], want[k])))) return false;
      if (body.sentence !== want.sentence) return false;
      return Object.entries(want).every(([k, v]) => k === 'sentence' || same(k === 'num_layers' ? cfg[k] ?? 1 : cfg[k], v));
    };
    return PRESETS.find(made) ?? null;
  }

  /** A JSON value with its objects' keys sorted, so two requests compare as data. */
  function canonical(v) {
    if (Array.isArray(v)) return v.map(canonical);
    if (v && typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]));
    return v;
  }

  /**
   * The caption shown with the maps for a trace's request `body` (and its config `cfg`): the preset's own when the
   * request is a preset's, else one line a constructed head ("head 0 · previous-token: …"); null when every head is
   * seeded. {preset, lines}: `preset` null for a configuration of the user's.
   */
  function captionFor(body, cfg) {
    const preset = presetOf(body, cfg);
    if (preset) return { preset: preset.id, title: preset.label, lines: [preset.caption] };
    const kinds = Array.isArray(cfg?.head_weights) ? cfg.head_weights : Array.isArray(body?.head_weights) ? body.head_weights : null;
    if (!kinds || kinds.every((k) => k === 'seeded')) return null;
    const lines = kinds.map((k, i) => (k === 'seeded' ? null : `${headName({ head_weights: kinds }, i)}: ${KIND_CAPTIONS[k] ?? ''}`))
      .filter(Boolean);
    return { preset: null, title: 'Constructed heads', lines };
  }

  globalThis.AttentionTrace.heads = Object.freeze({
    KIND_CAPTIONS, PRESETS, kindLabel, headName, headKinds, presetBody, presetOf, captionFor,
  });
})();
