/*
 * A strict reader for the XML the viewer writes (its SVG exports): it throws on anything not well-formed (an
 * unescaped "<" or "&", an unquoted or repeated attribute, a tag closed out of order, text outside the root,
 * a character XML 1.0 cannot hold) and returns the tree with every text and attribute value decoded, so a test
 * can read back exactly what a label said.
 *
 * Not a test file itself: svg.test.js requires it.
 */
'use strict';

const NAME = '[A-Za-z_][A-Za-z0-9_.:-]*';
const ENTITIES = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" };
const NOT_XML = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\uFFFE\uFFFF]|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function decode(text, where) {
  if (NOT_XML.test(text)) throw new Error(`a character XML cannot hold in ${where}: ${JSON.stringify(text)}`);
  return text.replace(/&([^;&<]*);|&/g, (all, ref) => {
    if (ref === undefined) throw new Error(`a bare "&" in ${where}: ${JSON.stringify(text)}`);
    if (ref in ENTITIES) return ENTITIES[ref];
    const num = /^#(?:x([0-9A-Fa-f]+)|([0-9]+))$/.exec(ref);
    if (!num) throw new Error(`an unknown entity &${ref}; in ${where}`);
    return String.fromCodePoint(num[1] ? parseInt(num[1], 16) : Number(num[2]));
  });
}

/** Parse a document: an optional XML declaration, one root element. Returns the root {tag, attrs, children}. */
function parseXml(text) {
  let rest = text.replace(/^<\?xml version="1\.0" encoding="UTF-8"\?>\n/, '');
  const stack = [];
  let root = null;
  const open = new RegExp(`^<(${NAME})((?:\\s+${NAME}\\s*=\\s*"[^"]*")*)\\s*(/?)>`);
  const close = new RegExp(`^</(${NAME})\\s*>`);
  while (rest.length) {
    let m;
    if ((m = open.exec(rest))) {
      if (root !== null && !stack.length) throw new Error('a second root element');
      const attrs = {};
      for (const [, k, v] of m[2].matchAll(new RegExp(`(${NAME})\\s*=\\s*"([^"]*)"`, 'g'))) {
        if (k in attrs) throw new Error(`attribute ${k} twice on <${m[1]}>`);
        if (v.includes('<')) throw new Error(`a "<" in attribute ${k} of <${m[1]}>`);
        attrs[k] = decode(v, `attribute ${k} of <${m[1]}>`);
      }
      const el = { tag: m[1], attrs, children: [] };
      if (stack.length) stack[stack.length - 1].children.push(el);
      else root = el;
      if (!m[3]) stack.push(el);
      rest = rest.slice(m[0].length);
    } else if ((m = close.exec(rest))) {
      const el = stack.pop();
      if (!el || el.tag !== m[1]) throw new Error(`</${m[1]}> closes ${el ? `<${el.tag}>` : 'nothing'}`);
      rest = rest.slice(m[0].length);
    } else if (rest[0] === '<') {
      throw new Error(`not a tag: ${JSON.stringify(rest.slice(0, 40))}`);
    } else {
      const end = rest.indexOf('<');
      const raw = end < 0 ? rest : rest.slice(0, end);
      if (!stack.length) {
        if (raw.trim()) throw new Error(`text outside the root: ${JSON.stringify(raw.slice(0, 40))}`);
      } else {
        stack[stack.length - 1].children.push(decode(raw, `<${stack[stack.length - 1].tag}>`));
      }
      rest = end < 0 ? '' : rest.slice(end);
    }
  }
  if (stack.length) throw new Error(`<${stack[stack.length - 1].tag}> is never closed`);
  if (root === null) throw new Error('no root element');
  return root;
}

/** Every element of a tree, depth first. */
function* walk(el) {
  yield el;
  for (const kid of el.children) if (typeof kid === 'object') yield* walk(kid);
}

/** An element's text, its descendants' included. */
const textOf = (el) => el.children.map((kid) => (typeof kid === 'string' ? kid : textOf(kid))).join('');

module.exports = { parseXml, walk, textOf };
