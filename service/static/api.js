/*
 * attention-trace viewer: where the numbers come from. The service's public JSON API, or the trace a saved page
 * embeds.
 *
 * The page is a plain client of the API, exactly as a third-party frontend would be: POST /trace, POST /explain,
 * POST /trace/html and GET /version, each a literal fetch of this origin (tests/test_viewer.py lists them against
 * openapi.yaml). A saved page (service/offline_page.py) embeds its trace as <script type="application/json"> data;
 * once readEmbedded has found one, every request here refuses (and the saved page's CSP would refuse it too).
 *
 * Adds `api` to globalThis.AttentionTrace; nothing runs at load. tests/js/api.test.js runs the pure part
 * (unescapeScriptJson) under Node.
 */
'use strict';

(() => {
  let saved = false; // a saved trace: no request, ever

  class ServiceError extends Error {
    constructor(status, problem, text) {
      super(problem?.detail || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
      this.text = text;
    }
  }

  // The endpoints, each a literal fetch of this origin (tests/test_viewer.py lists them against openapi.yaml).
  const ENDPOINTS = {
    trace: (init) => fetch('trace', init),
    explain: (init) => fetch('explain', init),
    html: (init) => fetch('trace/html', init),
  };

  function refuseOffline() {
    if (saved) throw new Error('a saved trace makes no request'); // and its CSP would refuse one
  }

  /** A problem document, or null when the body is not JSON. */
  function parseProblem(text) {
    try {
      return JSON.parse(text);
    } catch {
      return null;
    }
  }

  /** POST a JSON body; {doc, text, body, ms}: the parsed answer and its exact text, or a ServiceError with the
   * problem document. */
  async function postJson(endpoint, body, signal) {
    refuseOffline();
    const started = performance.now();
    const res = await endpoint({
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, application/problem+json' },
      body: JSON.stringify(body),
      signal,
    });
    const text = await res.text();
    const doc = parseProblem(text);
    if (!res.ok || doc === null || typeof doc !== 'object') throw new ServiceError(res.status, doc, text);
    return { doc, text, body, ms: performance.now() - started };
  }

  /** GET /version: the service's versions and limits, or null when it does not answer. */
  async function getVersion() {
    refuseOffline();
    const res = await fetch('version', { headers: { Accept: 'application/json' } });
    if (!res.ok) return null;
    return res.json();
  }

  /** POST /trace/html: the one-file offline page of a trace, {blob, name} (name: the service's file name). */
  async function postHtml(body) {
    refuseOffline();
    const res = await ENDPOINTS.html({
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'text/html, application/problem+json' },
      body: JSON.stringify(body),
    });
    if (!res.ok) {
      const text = await res.text();
      throw new ServiceError(res.status, parseProblem(text), text);
    }
    const blob = await res.blob();
    const given = /filename="([^"]+)"/.exec(res.headers.get('Content-Disposition') || '');
    return { blob, name: given ? given[1] : null };
  }

  /**
   * The saved file writes "<" as \u003c inside its JSON (so no closing script tag can end the element early);
   * undo exactly that, only where the escape is not itself escaped, to get the service's exact bytes back.
   */
  const unescapeScriptJson = (text) =>
    text.replace(/(\\*)\\u003c/g, (all, slashes) => (slashes.length % 2 === 0 ? `${slashes}<` : all));

  /**
   * The trace a saved page embeds, {request, comparison, text, doc, view}, or null on the live page. `view`: the
   * address fragment (without "#") of the view the page was saved from (withView), or null; the page opens on it when
   * its own address has no fragment.
   */
  function readEmbedded(document) {
    const meta = document.getElementById('trace-data');
    const raw = document.getElementById('trace-json');
    if (!meta || !raw) return null;
    saved = true;
    const text = unescapeScriptJson(raw.textContent);
    const viewEl = document.getElementById('view-state');
    let view = null;
    try {
      const fragment = viewEl ? JSON.parse(viewEl.textContent).fragment : null;
      view = typeof fragment === 'string' ? fragment.replace(/^#/, '') : null;
    } catch {
      view = null; // an unreadable view: the page's defaults
    }
    return { ...JSON.parse(meta.textContent), text, doc: JSON.parse(text), view };
  }

  /**
   * A saved page (POST /trace/html's text) that opens on a view: `fragment` (an address fragment, url-state.js's
   * hashFor) written as inert data, <script type="application/json" id="view-state"> (never run, so the page's
   * Content-Security-Policy is unchanged), "<" escaped as in the trace's data, just before the trace's data (the
   * page's scripts come after both, and read them as they run). An address fragment still wins over it.
   * viewer/offline_page.py writes the same element.
   */
  function withView(html, fragment) {
    const at = html.indexOf('<script type="application/json" id="trace-data">');
    if (at < 0) return html;
    const data = JSON.stringify({ fragment: fragment.replace(/^#/, '') }).replace(/</g, '\\u003c');
    // (the closing tag in two pieces: the saved page inlines this file, which may not hold one whole)
    return `${html.slice(0, at)}<script type="application/json" id="view-state">${data}<${'/'}script>\n${html.slice(at)}`;
  }

  globalThis.AttentionTrace ??= {};
  globalThis.AttentionTrace.api = Object.freeze({
    ServiceError, ENDPOINTS, postJson, getVersion, postHtml, unescapeScriptJson, readEmbedded, withView,
  });
})();
