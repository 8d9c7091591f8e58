// The sluice root console: polls GET v1/overview (and, with the admin
// token, the admin API for the quota tree), keeps a short history of each
// number in memory for the charts, and edits a quota with PATCH
// v1/quotas/{name}: only the fields changed on the page are sent, with
// If-Match on the epoch the editor was filled from, so an edit made
// elsewhere meanwhile is not overwritten unseen.
//
// Names and ids come from the network, so the page is built with DOM
// nodes and text only. The token lives in this tab's session storage and
// travels as a bearer header; it is typed in the form, or given in the
// address's fragment (`/ui#token=...`), which is then cleared.
'use strict';

(() => {
  /** Samples kept per series (at 2 s a refresh, four minutes). */
  const HISTORY = 120;
  /** Quotas the tree fetches at most (pages of 1000). */
  const TREE_MAX = 2000;
  /** Busiest quotas asked for. */
  const TOP = 20;
  const TOKEN_KEY = 'sluice-admin-token';
  const SVG = 'http://www.w3.org/2000/svg';

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    period: 2000,
    timer: null,
    tick: 0,
    /** series name -> {values, seen (tick)} */
    history: new Map(),
    /** name -> quota, from the last tree fetch */
    quotas: new Map(),
    /** name -> quota, from the last overview's busiest quotas */
    busy: new Map(),
    selected: null,
    /** The selected quota as the editor was filled from it. */
    loaded: null,
    running: false,
  };

  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else if (key.startsWith('data-')) node.setAttribute(key, String(value));
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === 'string' ? document.createTextNode(child) : child);
    }
    return node;
  }

  /** A number for people: 1234567 -> 1.23M, 0.5 -> 0.5. */
  function fmt(x) {
    if (x === null || x === undefined || Number.isNaN(x)) return '-';
    const abs = Math.abs(x);
    if (abs >= 1e9) return (x / 1e9).toFixed(2).replace(/\.?0+$/, '') + 'G';
    if (abs >= 1e6) return (x / 1e6).toFixed(2).replace(/\.?0+$/, '') + 'M';
    if (abs >= 1e4) return (x / 1e3).toFixed(1).replace(/\.?0+$/, '') + 'k';
    if (Number.isInteger(x)) return String(x);
    return x.toFixed(2).replace(/\.?0+$/, '');
  }

  function pct(x) {
    return x === null || x === undefined ? '-' : Math.round(x * 100) + '%';
  }

  /** Seconds for people: 0.0012 -> 1.2 ms. */
  function secs(x) {
    if (x === null || x === undefined) return '-';
    const abs = Math.abs(x);
    if (abs < 1e-3) return (x * 1e6).toFixed(0) + ' µs';
    if (abs < 1) return (x * 1e3).toFixed(1) + ' ms';
    if (abs < 120) return x.toFixed(1) + ' s';
    if (abs < 7200) return (x / 60).toFixed(1) + ' min';
    if (abs < 172800) return (x / 3600).toFixed(1) + ' h';
    return (x / 86400).toFixed(1) + ' d';
  }

  function setNumber(id, value, text) {
    const node = $(id);
    node.textContent = text === undefined ? fmt(value) : text;
    node.setAttribute('data-value', value === null || value === undefined ? '' : String(value));
  }

  // ---------------------------------------------------------------- data

  async function api(method, path, body, extra) {
    const headers = Object.assign({ Accept: 'application/json' }, extra || {});
    if (state.token) headers.Authorization = 'Bearer ' + state.token;
    const init = { method, headers, cache: 'no-store', credentials: 'omit' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    return { status: response.status, ok: response.ok, data };
  }

  /** `{error: {field, message}}` as one line. */
  function errorText(reply) {
    const error = reply.data && reply.data.error;
    if (!error) return 'HTTP ' + reply.status;
    return reply.status + ': ' + (error.field ? error.field + ': ' : '') + error.message;
  }

  function record(name, value) {
    if (value === null || value === undefined || !Number.isFinite(value)) return;
    let series = state.history.get(name);
    if (!series) {
      series = { values: [], seen: 0 };
      state.history.set(name, series);
    }
    series.values.push(value);
    if (series.values.length > HISTORY) series.values.shift();
    series.seen = state.tick;
  }

  function values(name) {
    const series = state.history.get(name);
    return series ? series.values : [];
  }

  /** Drops the series of quotas not seen for a while (bounded memory). */
  function prune() {
    for (const [name, series] of state.history) {
      if (state.tick - series.seen > 30) state.history.delete(name);
    }
  }

  // -------------------------------------------------------------- charts

  /** An SVG line of `data`, scaled to its maximum and the dashed `refs`. */
  function chart(data, refs, width, height) {
    const svg = document.createElementNS(SVG, 'svg');
    // Drawn in a width x height box and stretched to the space it gets.
    svg.setAttribute('width', '100%');
    svg.setAttribute('height', height);
    svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    const lines = (refs || []).filter((r) => r && Number.isFinite(r.value));
    const top = Math.max(1e-9, ...data, ...lines.map((r) => r.value)) * 1.1;
    const y = (v) => (height - 1 - (v / top) * (height - 2)).toFixed(1);
    const step = width / Math.max(1, HISTORY - 1);
    const start = width - step * (data.length - 1);
    if (data.length > 0) {
      const points = data.map((v, i) => `${(start + i * step).toFixed(1)},${y(v)}`);
      const area = document.createElementNS(SVG, 'polygon');
      area.setAttribute('class', 'area');
      area.setAttribute('points', `${start.toFixed(1)},${height} ${points.join(' ')} ${width},${height}`);
      svg.append(area);
      const line = document.createElementNS(SVG, 'polyline');
      line.setAttribute('class', 'series');
      line.setAttribute('points', points.join(' '));
      svg.append(line);
    }
    for (const ref of lines) {
      const line = document.createElementNS(SVG, 'line');
      line.setAttribute('class', 'ref ' + (ref.cls || ''));
      line.setAttribute('x1', 0);
      line.setAttribute('x2', width);
      line.setAttribute('y1', y(ref.value));
      line.setAttribute('y2', y(ref.value));
      svg.append(line);
    }
    return svg;
  }

  function bar(fraction, rejecting) {
    const fill = el('span');
    fill.style.width = Math.min(100, Math.max(0, fraction * 100)).toFixed(1) + '%';
    let cls = 'bar';
    if (rejecting >= 1) cls += ' full';
    else if (rejecting > 0) cls += ' rejecting';
    return el('span', { class: cls, title: pct(fraction) + ' of high burst' }, fill);
  }

  // ------------------------------------------------------------ rendering

  function renderRoot(ov) {
    const status = $('root-status');
    status.textContent = ov.root.status;
    status.className = 'pill ' + ov.root.status;
    $('root-meta').textContent = `v${ov.root.version} · instance ${ov.root.instance}`;
  }

  function renderTotals(ov) {
    const t = ov.totals;
    setNumber('total-quotas', t.quotas);
    $('total-counters').textContent = `${fmt(t.counters)} with a counter`
      + (t.keys ? `, ${fmt(t.keys)} keys` : '');
    setNumber('total-limiters', t.limiters_active);
    $('total-limiters-seen').textContent = `${fmt(t.limiters_seen)} since start`;
    setNumber('total-syncs', t.syncs_per_second);
    setNumber('total-rejected', t.rejected_per_second);
    setNumber('total-rejecting', t.quotas_rejecting);
    $('total-full').textContent = `with rejections; ${fmt(t.quotas_full)} full now`;
    record('syncs', t.syncs_per_second);
    record('rejected', t.rejected_per_second);
    $('chart-syncs').replaceChildren(chart(values('syncs'), [], 300, 40));
    $('chart-rejected').replaceChildren(chart(values('rejected'), [], 300, 40));
  }

  function quotaButton(name) {
    return el('button', { class: 'link', type: 'button', text: name, onclick: () => select(name) });
  }

  /** A quota's limit in its own terms ("1000 / day"), as the root writes it. */
  function terms(q) {
    return q.terms || fmt(q.limit);
  }

  /**
   * The limit as a dashed line on a chart of units per second: only a
   * leaky quota's limit is a rate; a window quota's is per window.
   */
  function rateRefs(q) {
    return q.window ? [] : [{ value: q.limit }];
  }

  /**
   * A per-key quota's keys: "12 keys, busiest 00ab12cd…" (its busiest
   * keys' full hashes in the title; all of them in Busiest keys).
   */
  function keysCell(q) {
    if (!q.keys) return el('td', { class: 'muted', text: '-' });
    const busiest = q.keys.busiest;
    return el('td', { 'data-field': 'keys', 'data-value': q.keys.count, title: busiest.join(', ') },
      `${fmt(q.keys.count)} key${q.keys.count === 1 ? '' : 's'}`
        + (busiest.length ? `, busiest ${busiest[0].slice(0, 8)}…` : ''));
  }

  /**
   * Tiers beside a quota: "2 overrides · penalty 15m · 1 in force" ('-'
   * when it has none of them).
   */
  function tiersCell(q) {
    const parts = [];
    if (q.overrides) parts.push(`${fmt(q.overrides)} override${q.overrides === 1 ? '' : 's'}`);
    if (q.penalty) parts.push(`penalty ${q.penalty}`);
    if (q.penalties) parts.push(`${fmt(q.penalties)} in force`);
    if (parts.length === 0) return el('td', { class: 'muted', text: '-' });
    return el('td', { 'data-field': 'tiers', 'data-overrides': q.overrides || 0,
      'data-penalties': q.penalties || 0, text: parts.join(' · ') });
  }

  function renderPenalties(ov) {
    const rows = (ov.penalties || []).map((p) => el('tr', { 'data-penalty': p.quota + '/' + (p.key || '') },
      el('td', {}, quotaButton(p.quota)),
      el('td', { class: p.key ? 'mono' : 'muted', text: p.key || '(the quota)' }),
      el('td', { class: 'num', 'data-field': 'seconds_left', 'data-value': p.seconds_left, text: secs(p.seconds_left) })));
    $('penalties').tBodies[0].replaceChildren(...rows);
  }

  function renderBusiest(ov) {
    const body = $('busiest').tBodies[0];
    const rows = [];
    state.busy = new Map((ov.quotas || []).map((q) => [q.name, q]));
    for (const q of ov.quotas || []) {
      record('level:' + q.name, q.level);
      record('fill:' + q.name, q.fill_rate);
      record('rej:' + q.name, q.rejected_rate);
      rows.push(el('tr', { 'data-quota': q.name },
        el('td', {}, quotaButton(q.name)),
        el('td', { 'data-field': 'terms', text: terms(q) }),
        el('td', { text: q.parent || '-' }),
        el('td', { class: 'num', 'data-field': 'level', 'data-value': q.level, text: fmt(q.level) }),
        el('td', {}, bar(q.fullness, q.rejecting)),
        el('td', { class: 'num', 'data-field': 'fill_rate', 'data-value': q.fill_rate, text: fmt(q.fill_rate) }),
        el('td', {}, chart(values('fill:' + q.name), rateRefs(q), 100, 24)),
        el('td', { class: 'num', 'data-field': 'rejecting', 'data-value': q.rejecting, text: pct(q.rejecting) }),
        el('td', { class: 'num', 'data-field': 'rejected_rate', 'data-value': q.rejected_rate, text: fmt(q.rejected_rate) }),
        el('td', { class: 'rejected' }, chart(values('rej:' + q.name), [], 100, 24)),
        keysCell(q),
        tiersCell(q)));
    }
    body.replaceChildren(...rows);
    const s = ov.sampled;
    $('busiest-note').textContent = rows.length === 0 ? 'No quota has received weight recently.'
      : `Ranked ${fmt(s.counters_scanned)} counters${s.counters_complete ? '' : ' (the most recently updated)'}, `
        + 'busiest first: most rejected checks per second (what the limiters report), then the share of checks '
        + 'of weight 1 the level rejects now, then the level, then the fill rate. A per-key quota shows its '
        + 'fullest key\'s level, its keys\' summed fill rate and all their rejections.';
  }

  function renderKeys(ov) {
    const rows = (ov.keys || []).map((k) => el('tr', { 'data-key': k.key },
      el('td', {}, quotaButton(k.quota)),
      el('td', { class: 'mono', text: k.key }),
      el('td', { class: 'num', 'data-field': 'level', 'data-value': k.level, text: fmt(k.level) }),
      el('td', {}, bar(k.fullness, k.rejecting)),
      el('td', { class: 'num', 'data-field': 'fill_rate', 'data-value': k.fill_rate, text: fmt(k.fill_rate) }),
      el('td', { text: terms(k) }),
      el('td', { class: 'num', 'data-field': 'rejecting', text: pct(k.rejecting) })));
    $('keys').tBodies[0].replaceChildren(...rows);
  }

  function renderLimiters(ov) {
    const rows = (ov.limiters || []).map((l) => el('tr', { 'data-limiter': l.id },
      el('td', { text: l.id }),
      el('td', { class: 'num', text: secs(l.last_sync_seconds_ago) + ' ago' }),
      el('td', { class: 'num', text: fmt(l.syncs) }),
      el('td', { class: 'num', 'data-field': 'clock_offset', 'data-value': l.clock_offset_seconds, text: secs(l.clock_offset_seconds) }),
      el('td', { class: 'num', text: secs(l.round_trip_seconds) })));
    $('limiters').tBodies[0].replaceChildren(...rows);
  }

  function renderDb(ov) {
    const db = ov.db;
    const items = [
      ['backend', db.backend],
      ['state', !db.up ? `down for ${secs(db.down_seconds)}`
        : db.writable === false ? 'read-only: edits refused, syncs served' : 'up'],
      ['last reload', db.reload_age_seconds === null ? 'never' : secs(db.reload_age_seconds) + ' ago'],
      ['quota epoch', fmt(db.epoch)],
      ['failed operations', fmt(db.failures)],
    ];
    if (db.error) items.push(['last error', db.error]);
    const nodes = [];
    for (const [term, detail] of items) {
      nodes.push(el('dt', { text: term }), el('dd', { 'data-field': term, text: detail }));
    }
    $('db').replaceChildren(...nodes);
  }

  /** Shows or hides what needs the admin token. */
  function renderAccess(ov, refused) {
    const admin = ov.access === 'admin';
    for (const node of document.querySelectorAll('.locked')) node.hidden = admin;
    for (const id of ['busiest', 'limiters', 'tree', 'tree-prefix']) $(id).hidden = !admin;
    if (!admin) {
      $('busiest').tBodies[0].replaceChildren();
      $('tree').replaceChildren();
      $('tree-count').textContent = '';
      $('editor-section').hidden = true;
      state.selected = null;
      state.loaded = null;
    }
    // Without an admin token a root answers everyone as its admin: no
    // token to enter, and the page says what that means.
    $('token-form').hidden = !ov.token_required;
    const notice = $('auth-status');
    if (!ov.token_required) {
      notice.textContent = 'Open root: it has no admin token, so anyone who can reach it sees every quota '
        + 'and limiter and can create, edit and delete quotas from this page or the API. (A root without '
        + 'a token listens on loopback only; start it with --admin-token-file to require one.)';
      notice.className = 'notice warn';
      notice.hidden = false;
    } else if (refused) {
      notice.textContent = 'The root refused this token (401): showing public numbers only. Enter the admin token above.';
      notice.className = 'notice bad';
      notice.hidden = false;
    } else if (!admin) {
      notice.textContent = 'Public view, read-only: numbers without names. Quota and limiter names, the tree '
        + 'and edits need the admin token.';
      notice.className = 'notice';
      notice.hidden = false;
    } else {
      notice.hidden = true;
    }
  }

  // ---------------------------------------------------------------- tree

  async function fetchTree() {
    const prefix = $('tree-prefix').value.trim();
    const quotas = [];
    let after = null;
    let more = false;
    while (quotas.length < TREE_MAX) {
      const query = new URLSearchParams({ limit: String(Math.min(1000, TREE_MAX - quotas.length)) });
      if (prefix) query.set('prefix', prefix);
      if (after) query.set('after', after);
      const reply = await api('GET', 'v1/quotas?' + query);
      if (!reply.ok) throw new Error('quota list: ' + errorText(reply));
      quotas.push(...reply.data.quotas);
      after = reply.data.next;
      more = after !== null;
      if (!more) break;
    }
    return { quotas, more };
  }

  function renderTree(list) {
    state.quotas = new Map(list.quotas.map((q) => [q.name, q]));
    const children = new Map();
    const tops = [];
    for (const q of list.quotas) {
      // A per-key quota has no counter of its own: the overview gives its
      // keys' figures, when it is among the busiest.
      if (!q.per_key) {
        record('level:' + q.name, q.level);
        record('fill:' + q.name, q.fill_rate);
        record('rej:' + q.name, q.rejected_rate);
      }
      if (q.parent && state.quotas.has(q.parent)) {
        if (!children.has(q.parent)) children.set(q.parent, []);
        children.get(q.parent).push(q);
      } else {
        tops.push(q);
      }
    }
    // Indented inside the name column, so the figures line up at every depth.
    const indent = (span, depth) => {
      span.style.paddingLeft = depth * 18 + 'px';
      return span;
    };
    const node = (listed, depth) => {
      // A per-key quota's figures are its keys', from the overview.
      const q = listed.per_key ? Object.assign({}, listed, state.busy.get(listed.name)
        || { level: null, fill_rate: null }) : listed;
      const fullness = q.high_burst > 0 ? q.level / q.high_burst : 0;
      // Colour by the band the level is in (the overview ranks by the exact share).
      const band = q.level === null ? 0 : q.level + 1 > q.high_burst ? 1 : q.level + 1 > q.low_burst ? 0.5 : 0;
      const item = el('li', { 'data-quota': q.name, class: q.name === state.selected ? 'selected' : '' },
        el('div', { class: 'node' },
          indent(el('span', { class: 'name' }, quotaButton(q.name),
            q.parent && !state.quotas.has(q.parent) ? el('span', { class: 'muted', text: ` (under ${q.parent})` }) : null), depth),
          el('span', { class: 'figure terms', 'data-field': 'limit', 'data-value': q.limit, title: kind(q), text: terms(q) }),
          bar(fullness, band),
          el('span', { class: 'figure', 'data-field': 'level', 'data-value': q.level, text: 'level ' + fmt(q.level),
            title: listed.per_key ? "a per-key quota: its fullest key's level" : null }),
          el('span', { class: 'figure', 'data-field': 'fill_rate', 'data-value': q.fill_rate, text: fmt(q.fill_rate) + '/s in' })));
      const kids = children.get(q.name);
      // The tree is at most 8 deep; the bound guards against a cycle.
      if (kids && depth < 16) item.append(el('ul', {}, ...kids.map((k) => node(k, depth + 1))));
      return item;
    };
    $('tree').replaceChildren(...tops.map((q) => node(q, 0)));
    $('tree-count').textContent = `${list.quotas.length} quotas` + (list.more ? ` shown (the first ${TREE_MAX}; narrow with a prefix)` : '');
  }

  // -------------------------------------------------------------- editor

  /** What kind of quota: "sliding 1m window, per key", "leaky bucket". */
  function kind(q) {
    const parts = [q.window ? (q.sliding ? 'sliding ' : '') + q.window + ' window' : 'leaky bucket'];
    if (q.per_key) parts.push('per key');
    return parts.join(', ');
  }

  /** The limit field's unit follows the window chosen on the page. */
  function limitLabel() {
    const windowed = $('edit-window').value;
    $('edit-limit-label').textContent = windowed
      ? `limit (units per ${windowed} window)` : 'limit (units per second: leaky bucket)';
  }

  /** Fills the editor from `q` (a quota as the admin API shows it). */
  function fillEditor(q) {
    state.loaded = q;
    $('edit-limit').value = q.limit;
    $('edit-low').value = q.low_burst;
    $('edit-high').value = q.high_burst;
    $('edit-window').value = q.window || '';
    $('edit-sliding').checked = !!q.sliding;
    $('edit-sliding').disabled = !q.window;
    $('edit-per-key').checked = !!q.per_key;
    $('edit-parent').value = q.parent || '';
    $('editor-kind').textContent = `${terms(q)} · ${kind(q)} · epoch ${q.epoch}`;
    limitLabel();
  }

  async function select(name, keepResult) {
    state.selected = name;
    $('editor-section').hidden = false;
    $('editor-name').textContent = name;
    if (!keepResult) {
      $('edit-result').textContent = '';
      $('edit-result').className = 'muted';
    }
    for (const li of document.querySelectorAll('#tree li')) {
      li.classList.toggle('selected', li.getAttribute('data-quota') === name);
    }
    const reply = await api('GET', 'v1/quotas/' + encodeURIComponent(name));
    if (!reply.ok) {
      showEditResult(false, errorText(reply));
      return;
    }
    const q = reply.data;
    fillEditor(q);
    const limiters = (q.limiters || []).map((l) => `${l.limiter} (${secs(l.seconds_ago)} ago)`);
    $('editor-limiters').textContent = limiters.length ? 'Recent limiters: ' + limiters.join(', ') : 'No limiter sent weight recently.';
    renderEditorCharts();
  }

  function renderEditorCharts() {
    const q = state.selected && state.quotas.get(state.selected);
    if (!q) return;
    $('chart-level').replaceChildren(chart(values('level:' + q.name),
      [{ value: q.low_burst, cls: 'low' }, { value: q.high_burst }], 520, 80));
    $('chart-fill-title').textContent = q.window
      ? `Fill rate, units per second (the limit, ${terms(q)}, is per window)`
      : 'Fill rate, units per second (limit dashed)';
    $('chart-fill').replaceChildren(chart(values('fill:' + q.name), rateRefs(q), 520, 80));
    $('chart-rejected-quota').replaceChildren(chart(values('rej:' + q.name), [], 520, 80));
  }

  function showEditResult(ok, text) {
    const node = $('edit-result');
    node.textContent = text;
    node.className = ok ? 'ok' : 'bad';
  }

  /**
   * The fields the form changed from the quota it was filled from, as a
   * PATCH body: an emptied burst or parent is null (its default, or
   * top-level), a window of "none" is null.
   */
  function changes(q) {
    const body = {};
    const number = (id) => {
      const text = $(id).value.trim();
      return text === '' ? null : Number(text);
    };
    const limit = number('edit-limit');
    if (limit !== q.limit) body.limit = limit;
    const low = number('edit-low');
    if (low !== q.low_burst) body.low_burst = low;
    const high = number('edit-high');
    if (high !== q.high_burst) body.high_burst = high;
    const windowed = $('edit-window').value || null;
    if (windowed !== (q.window || null)) body.window = windowed;
    const sliding = windowed !== null && $('edit-sliding').checked;
    if (sliding !== !!q.sliding) body.sliding = sliding;
    const perKey = $('edit-per-key').checked;
    if (perKey !== !!q.per_key) body.per_key = perKey;
    const parent = $('edit-parent').value.trim() || null;
    if (parent !== (q.parent || null)) body.parent = parent;
    return body;
  }

  async function save(event) {
    event.preventDefault();
    const name = state.selected;
    const q = state.loaded;
    if (!name || !q || q.name !== name) return;
    const body = changes(q);
    if (Object.keys(body).length === 0) {
      showEditResult(true, 'unchanged (nothing was edited)');
      return;
    }
    $('edit-save').disabled = true;
    try {
      const path = 'v1/quotas/' + encodeURIComponent(name);
      const reply = await api('PATCH', path, body, { 'If-Match': `"${q.epoch}"` });
      if (reply.ok) {
        showEditResult(true, `${reply.data.changed ? 'saved' : 'unchanged'} (epoch ${reply.data.epoch})`);
        if (reply.data.quota) fillEditor(reply.data.quota);
        await refresh();
      } else if (reply.status === 401) {
        showEditResult(false, '401: edits need the admin token; the root refused this one.');
      } else if (reply.status === 412) {
        // Changed elsewhere since the editor was filled: show it as it is
        // now rather than overwrite what someone else saved.
        await select(name, true);
        showEditResult(false, '412: this quota was changed elsewhere since it was opened; ' +
          'the editor now shows its current values: edit again');
      } else {
        showEditResult(false, errorText(reply));
      }
    } catch (error) {
      showEditResult(false, 'cannot reach the root: ' + error.message);
    } finally {
      $('edit-save').disabled = false;
    }
  }

  // ---------------------------------------------------------------- loop

  async function refresh() {
    if (state.running) return;
    state.running = true;
    state.tick += 1;
    try {
      let reply = await api('GET', 'v1/overview?top=' + TOP);
      let refused = false;
      if (reply.status === 401) {
        // A wrong token: say so, and show what anyone may see.
        refused = true;
        const token = state.token;
        state.token = '';
        reply = await api('GET', 'v1/overview?top=' + TOP);
        state.token = token;
      }
      if (!reply.ok) throw new Error(errorText(reply));
      const ov = reply.data;
      renderRoot(ov);
      renderAccess(ov, refused);
      renderTotals(ov);
      renderDb(ov);
      if (ov.access === 'admin') {
        renderBusiest(ov);
        renderLimiters(ov);
        renderKeys(ov);
        renderPenalties(ov);
        renderTree(await fetchTree());
        renderEditorCharts();
      }
      $('keys-section').hidden = !ov.keys;
      $('penalties-section').hidden = !ov.penalties;
      $('error').hidden = true;
      $('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      $('updated').setAttribute('data-tick', String(state.tick));
      prune();
    } catch (error) {
      const node = $('error');
      node.textContent = 'Cannot read the root: ' + error.message + ' (retrying)';
      node.hidden = false;
      $('root-status').textContent = 'unreachable';
      $('root-status').className = 'pill bad';
    } finally {
      state.running = false;
    }
  }

  function schedule() {
    clearTimeout(state.timer);
    state.timer = setTimeout(async () => {
      await refresh();
      schedule();
    }, state.period);
  }

  /**
   * A token given in the address's fragment (`/ui#token=...`: a fragment
   * never reaches the server or its logs), taken as if it were typed in
   * the form, then taken out of the address bar and the history.
   */
  function tokenFromFragment() {
    const token = (new URLSearchParams(location.hash.slice(1)).get('token') || '').trim();
    if (!token) return false;
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, '', location.pathname + location.search);
    return true;
  }

  function start() {
    $('token').value = '';
    tokenFromFragment();
    window.addEventListener('hashchange', () => {
      if (tokenFromFragment()) refresh();
    });
    $('token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      state.token = $('token').value.trim();
      $('token').value = '';
      if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
      else sessionStorage.removeItem(TOKEN_KEY);
      refresh();
    });
    $('token-forget').addEventListener('click', () => {
      state.token = '';
      sessionStorage.removeItem(TOKEN_KEY);
      refresh();
    });
    $('refresh').addEventListener('change', () => {
      state.period = Number($('refresh').value);
      schedule();
    });
    $('tree-prefix').addEventListener('change', refresh);
    $('editor-form').addEventListener('submit', save);
    $('edit-window').addEventListener('change', () => {
      // A leaky bucket has nothing to slide.
      const windowed = $('edit-window').value !== '';
      $('edit-sliding').disabled = !windowed;
      if (!windowed) $('edit-sliding').checked = false;
      limitLabel();
    });
    $('edit-close').addEventListener('click', () => {
      state.selected = null;
      state.loaded = null;
      $('editor-section').hidden = true;
      for (const li of document.querySelectorAll('#tree li.selected')) li.classList.remove('selected');
    });
    refresh().then(schedule);
  }

  start();
})();
