/* api.js: the saved page's embedded JSON, and the requests a saved page refuses to send. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { load } = require('./load.js');

/** A stand-in for the saved page's document: the two JSON data blocks, or none. */
const page = (blocks) => ({ getElementById: (id) => (id in blocks ? { textContent: blocks[id] } : null) });
/** What service/offline_page.py writes into the page: every "<" as \u003c. */
const forScript = (json) => json.replaceAll('<', '\\u003c');

test('unescapeScriptJson undoes exactly what the saved page escaped', () => {
  const { unescapeScriptJson } = load('api.js').api;
  for (const token of ['</script>', '<!--', 'a\\u003cb', '\\\\u003c', '\\<', 'plain', '']) {
    const json = JSON.stringify({ tokens: [token, `x${token}<`] });
    assert.equal(unescapeScriptJson(forScript(json)), json, token);
  }
  assert.equal(unescapeScriptJson('"\\u003c"'), '"<"');
  assert.equal(unescapeScriptJson('"\\\\u003c"'), '"\\\\u003c"', 'an escaped backslash before u003c is text');
  assert.equal(unescapeScriptJson('"\\\\\\u003c"'), '"\\\\<"');
});

test('a saved page: the embedded trace, the service\'s exact bytes, and no request', async () => {
  const { readEmbedded, postJson, getVersion, postHtml, ENDPOINTS } = load('api.js').api;
  const calls = [];
  globalThis.fetch = async (...args) => { calls.push(args); throw new Error('no network here'); };
  const trace = '{"tokens":[{"text":"</script>"}],"x":1.0000000000000002}';
  const embedded = readEmbedded(page({
    'trace-data': forScript('{"request":{"tokens":["</script>"]},"comparison":null}'),
    'trace-json': forScript(trace),
  }));
  assert.equal(embedded.text, trace);
  assert.deepEqual(embedded.doc, JSON.parse(trace));
  assert.deepEqual(embedded.request, { tokens: ['</script>'] });
  assert.equal(embedded.comparison, null);
  await assert.rejects(postJson(ENDPOINTS.trace, {}), /a saved trace makes no request/);
  await assert.rejects(getVersion(), /a saved trace makes no request/);
  await assert.rejects(postHtml({}), /a saved trace makes no request/);
  assert.deepEqual(calls, []);
});

test('the live page: no embedded trace; answers and problems', async () => {
  const { readEmbedded, postJson, ServiceError } = load('api.js').api;
  assert.equal(readEmbedded(page({ 'trace-data': '{}' })), null, 'both data blocks, or none');
  const answer = (status, text) => async (init) => ({ ok: status < 300, status, text: async () => text, init });
  const ok = await postJson(answer(200, '{"a":1.5}'), { sentence: 'x' });
  assert.deepEqual([ok.doc, ok.text, ok.body], [{ a: 1.5 }, '{"a":1.5}', { sentence: 'x' }]);
  assert.ok(ok.ms >= 0);
  let sent = null;
  await postJson(async (init) => { sent = init; return { ok: true, status: 200, text: async () => '{}' }; }, { b: [1] }, 'sig');
  assert.deepEqual(sent, { method: 'POST', body: '{"b":[1]}', signal: 'sig',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, application/problem+json' } });

  const problem = '{"title":"Invalid request","status":422,"detail":"num_heads: 5 does not divide 24","errors":[]}';
  await assert.rejects(postJson(answer(422, problem), {}), (err) => err instanceof ServiceError && err.status === 422
    && err.problem.status === 422 && err.message === 'num_heads: 5 does not divide 24' && err.text === problem);
  await assert.rejects(postJson(answer(502, '<html>bad gateway</html>'), {}),
    (err) => err instanceof ServiceError && err.problem === null && err.message === 'HTTP 502');
  await assert.rejects(postJson(answer(200, '"just a string"'), {}), (err) => err instanceof ServiceError);
});

test('withView writes the view as inert data before the trace, and readEmbedded reads it back', () => {
  const { withView, readEmbedded } = load('api.js').api;
  const html = '<html><body><p>x</p><script type="application/json" id="trace-data">{}</script>\n<script>app</script></body></html>';
  const saved = withView(html, '#q=2&head=1&text=150&theme=dark&key=</script>');
  assert.ok(saved.startsWith('<html><body><p>x</p><script type="application/json" id="view-state">{"fragment":"q=2&head=1'));
  assert.ok(!saved.slice(0, saved.indexOf('id="trace-data"')).includes('</script><'), 'no "<" of the view ends its element');
  assert.ok(saved.endsWith('<script type="application/json" id="trace-data">{}</script>\n<script>app</script></body></html>'));
  assert.equal(withView('<html>no trace</html>', '#q=1'), '<html>no trace</html>');
  const view = /id="view-state">([^<]*)</.exec(saved)[1];
  const embedded = readEmbedded(page({ 'trace-data': '{"request":{},"comparison":null}', 'trace-json': '{}', 'view-state': view }));
  assert.equal(embedded.view, 'q=2&head=1&text=150&theme=dark&key=</script>');
  assert.equal(readEmbedded(page({ 'trace-data': '{"request":{}}', 'trace-json': '{}' })).view, null);
  assert.equal(readEmbedded(page({ 'trace-data': '{"request":{}}', 'trace-json': '{}', 'view-state': 'not json' })).view, null);
});
