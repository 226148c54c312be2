/* The viewer's scripts as files: the pure ones need no browser, and all load in index.html's order. */
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { SCRIPTS, PURE, BROWSER_ONLY, load, source } = require('./load.js');

test('index.html loads the pure scripts first, app.js last', () => {
  assert.deepEqual(SCRIPTS.slice(0, PURE.length), PURE);
  assert.equal(SCRIPTS.at(-1), 'app.js');
});

test('the pure scripts use no browser API, so they run anywhere', () => {
  // At run time every test of them runs with the browser's globals trapped (load.js); here, the source: no call
  // of or member of a browser global, nor the timers, fetch and clocks that Node happens to have too.
  for (const name of PURE) {
    const code = source(name).replace(/\/\*[\s\S]*?\*\/|\/\/.*$/gm, ''); // comments may mention the page
    const uses = code.match(new RegExp(`(?<![.\\w$])(?:${BROWSER_ONLY.join('|')}|fetch|performance|setTimeout|setInterval|`
      + 'requestAnimationFrame|queueMicrotask)\\s*[.[(]', 'g'));
    assert.equal(uses, null, `${name} uses ${uses}`);
  }
  assert.throws(() => globalThis.document, /document is a browser API/);
});

test('each pure script adds its part to the namespace, frozen', () => {
  const AT = load(...PURE);
  assert.deepEqual(Object.keys(AT), ['format', 'trace', 'fields', 'urlState', 'heads', 'svg', 'cell', 'block']);
  for (const part of Object.values(AT)) assert.ok(Object.isFrozen(part));
});

test('every script loads without a page when it runs nothing at load: all but app.js', () => {
  const AT = load(...SCRIPTS.slice(0, -1));
  assert.deepEqual(Object.keys(AT), ['format', 'trace', 'fields', 'urlState', 'heads', 'svg', 'cell', 'block', 'api', 'render', 'explain']);
  assert.equal(typeof AT.render.create, 'function');
  assert.equal(typeof AT.explain.create, 'function');
});
