/*
 * Loads the viewer's scripts under Node as the page does: classic scripts, evaluated in order in one global scope,
 * each adding its part to globalThis.AttentionTrace. No bundler, no package, no change to the files.
 *
 * Not a test file itself: the *.test.js files require it (node --test tests/js/*.test.js runs them).
 */
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const vm = require('node:vm');

const STATIC = path.resolve(__dirname, '..', '..', 'service', 'static');

/** The scripts index.html loads, in its order (format.js … app.js). */
const SCRIPTS = [...fs.readFileSync(path.join(STATIC, 'index.html'), 'utf8')
  .matchAll(/<script src="static\/([a-z0-9-]+\.js)" defer><\/script>/g)].map((m) => m[1]);

/** The scripts that need no browser: they must load and run under Node. */
const PURE = ['format.js', 'trace.js', 'fields.js', 'url-state.js', 'heads.js', 'svg.js', 'cell.js', 'block.js'];

/** Browser globals Node does not have: while the tests run, touching one throws (so a pure script cannot). */
const BROWSER_ONLY = ['document', 'window', 'location', 'history', 'navigator', 'localStorage', 'sessionStorage',
  'XMLSerializer', 'DOMParser', 'Node'];
for (const name of BROWSER_ONLY) {
  Object.defineProperty(globalThis, name, {
    configurable: true,
    get() { throw new ReferenceError(`${name} is a browser API: the viewer's scripts under test must not need it`); },
  });
}

/**
 * Evaluate the named scripts (in the order given, which must be index.html's) in this process's global scope,
 * from a fresh namespace, and return globalThis.AttentionTrace. Objects they make are this realm's, so
 * assert.deepStrictEqual compares them with plain literals.
 */
function load(...names) {
  delete globalThis.AttentionTrace;
  for (const name of names) {
    const file = path.join(STATIC, name);
    vm.runInThisContext(fs.readFileSync(file, 'utf8'), { filename: file });
  }
  return globalThis.AttentionTrace;
}

const source = (name) => fs.readFileSync(path.join(STATIC, name), 'utf8');

module.exports = { STATIC, SCRIPTS, PURE, BROWSER_ONLY, load, source };
