// quay console: one page, no framework, nothing fetched but this broker's
// own /api. Every view reads the management API with the credentials of
// the login form (HTTP Basic), which the broker checks as for any client;
// the page itself holds no data.
//
// Credentials live in sessionStorage (this tab only, gone when it closes).
// For scripts (the headless browser of tests/integration/40-console.py) the
// URL fragment may carry them once, "#cluster&user=U&password=P": the
// fragment is never sent to the server, and the page moves it into
// sessionStorage and removes it from the address at once. "&queue=NAME"
// fills in the cluster view's queue search (a link to one queue's place).
'use strict';

const REFRESH_MS = 1500;      // the live views (overview, cluster)
const RECENT_MS = 30000;      // an event this young is highlighted on the ring
const EVENTS_SHOWN = 40;      // of the broker's last 100 (GET /api/cluster/events)
const LIST_REFRESH_MS = 5000; // lists: each refresh asks the page's primaries for counts
const AUTH_KEY = 'quay.console.auth';

const state = {
  view: 'overview',
  auth: null,           // "Basic ..." or null
  busy: false,          // a refresh is in flight: skip the next tick
  again: false,         // a refresh was asked for while busy: run it after
  refreshes: 0,         // completed refreshes, shown for scripts (data-refreshes)
  lastList: 0,
  overviewPrev: null,   // {t, stats} of the previous overview, for rates
  list: {page: 1, size: 50, filter: '', sort: null, reverse: false},
  search: '',           // the cluster view's queue search
  picked: null,         // {vhost, name} of the queue shown on the ring
  found: null,          // the last search's answer, with its search and time
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c));
  return e;
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(n) {
  if (n === undefined || n === null) return '-';
  if (typeof n !== 'number') return String(n);
  return n.toLocaleString('en-US', {maximumFractionDigits: 1});
}

function setStatus(text) { $('status').textContent = text || ''; }

// ---- the API ------------------------------------------------------------

class LoginNeeded extends Error {}

async function api(path) {
  const response = await fetch(path, {
    headers: {Authorization: state.auth, Accept: 'application/json'},
    cache: 'no-store',
    credentials: 'omit',
  });
  if (response.status === 401) {
    let reason = 'Login failed';
    try { reason = (await response.json()).reason || reason; } catch (e) { /* empty */ }
    if (reason.startsWith('Login failed')) throw new LoginNeeded(reason);
    throw new Error(reason); // a right this user lacks: say so, stay logged in
  }
  if (!response.ok) {
    const error = new Error(`${path}: ${response.status} ${response.statusText}`);
    try { error.code = (await response.json()).error; } catch (e) { /* empty */ }
    throw error;
  }
  return response.json();
}

// ---- login ---------------------------------------------------------------

function takeFragmentLogin() {
  const parts = location.hash.replace(/^#/, '').split('&');
  const params = new URLSearchParams(parts.slice(1).join('&'));
  if (parts[0]) state.view = parts[0];
  if (params.has('queue')) {
    state.search = params.get('queue');
    $('cl-search').value = state.search;
  }
  if (params.has('user')) {
    const pair = `${params.get('user')}:${params.get('password') || ''}`;
    sessionStorage.setItem(AUTH_KEY, 'Basic ' + btoa(unescape(encodeURIComponent(pair))));
    history.replaceState(null, '', '#' + state.view);
  }
}

function showLogin(message) {
  state.auth = null;
  sessionStorage.removeItem(AUTH_KEY);
  for (const v of document.querySelectorAll('.view')) v.hidden = true;
  $('nav').hidden = true;
  $('logout').hidden = true;
  $('who').textContent = '';
  $('login').hidden = false;
  $('login-error').textContent = message || '';
}

async function logIn(auth) {
  state.auth = auth;
  try {
    const me = await api('/api/whoami');
    sessionStorage.setItem(AUTH_KEY, auth);
    $('login').hidden = true;
    $('nav').hidden = false;
    $('logout').hidden = false;
    $('who').textContent = me.name;
    show(state.view);
  } catch (e) {
    showLogin(e.message);
  }
}

// ---- views ---------------------------------------------------------------

const LISTS = {
  queues: {title: 'Queues', path: '/api/queues', sort: 'name', columns: [
    ['vhost', 'Vhost'], ['name', 'Name'], ['state', 'State'],
    ['messages_ready', 'Ready', 'num'], ['messages_unacknowledged', 'Unacked', 'num'],
    ['messages', 'Total', 'num'], ['consumers', 'Consumers', 'num'],
    ['primary', 'Primary'], ['backups', 'Backups'], ['in_sync', 'In sync']]},
  exchanges: {title: 'Exchanges', path: '/api/exchanges', sort: 'name', columns: [
    ['vhost', 'Vhost'], ['name', 'Name'], ['type', 'Type'], ['durable', 'Durable'],
    ['auto_delete', 'Auto-delete'], ['internal', 'Internal']]},
  connections: {title: 'Connections', path: '/api/connections', sort: 'name', columns: [
    ['name', 'Name'], ['user', 'User'], ['vhost', 'Vhost'], ['node', 'Broker'],
    ['state', 'State'], ['channels', 'Channels', 'num'], ['protocol', 'Protocol'],
    ['ssl', 'TLS']]},
  users: {title: 'Users', path: '/api/users', sort: 'name', columns: [
    ['name', 'Name'], ['tags', 'Tags']]},
  policies: {title: 'Policies', path: '/api/policies', sort: 'name', columns: [
    ['vhost', 'Vhost'], ['name', 'Name'], ['pattern', 'Pattern'],
    ['backups', 'Backups', 'num'], ['priority', 'Priority', 'num']]},
};

function show(view) {
  if (view !== 'overview' && view !== 'cluster' && !LISTS[view]) view = 'overview';
  if (view !== state.view) {
    state.list = {page: 1, size: state.list.size, filter: '', sort: null, reverse: false};
    $('list-filter').value = '';
  }
  state.view = view;
  for (const a of document.querySelectorAll('#nav a'))
    a.classList.toggle('current', a.getAttribute('href') === '#' + view);
  $('view-overview').hidden = view !== 'overview';
  $('view-cluster').hidden = view !== 'cluster';
  $('view-list').hidden = !LISTS[view];
  state.lastList = 0;
  refresh(true);
}

async function refresh(now) {
  if (!state.auth) return;
  if (state.busy) { state.again = state.again || now; return; }
  if (LISTS[state.view] && !now && Date.now() - state.lastList < LIST_REFRESH_MS) return;
  state.busy = true;
  try {
    if (state.view === 'overview') await refreshOverview();
    else if (state.view === 'cluster') await refreshCluster();
    else { await refreshList(LISTS[state.view]); state.lastList = Date.now(); }
    setStatus('');
    state.refreshes++;
    document.body.dataset.refreshes = state.refreshes;
  } catch (e) {
    if (e instanceof LoginNeeded) showLogin(e.message);
    else setStatus(e.message);
  } finally {
    state.busy = false;
  }
  if (state.again) { state.again = false; refresh(true); }
}

// ---- overview --------------------------------------------------------------

function rate(now, prev, seconds) {
  if (prev === undefined || now === undefined || seconds <= 0) return '-';
  return fmt(Math.max(0, (now - prev) / seconds));
}

async function refreshOverview() {
  const o = await api('/api/overview');
  const t = performance.now();
  const messages = (o.messages_ready || 0) + (o.messages_unacknowledged || 0);
  $('ov-node').textContent = o.node ? `(answered by ${o.node})` : '';
  $('ov-messages').textContent = fmt(messages);
  $('ov-ready').textContent = fmt(o.messages_ready);
  $('ov-unacked').textContent = fmt(o.messages_unacknowledged);
  for (const k of ['connections', 'channels', 'queues', 'consumers'])
    $('ov-' + k).textContent = fmt(o[k]);
  const alarms = o.alarms || [];
  $('ov-alarms').textContent = alarms.length ? alarms.join(', ') : 'none';
  $('ov-alarms').classList.toggle('error', alarms.length > 0);
  $('ov-version').textContent = `${o.product || 'quay'} ${o.version || ''}`;
  $('ov-uptime').textContent = `${fmt((o.uptime_ms || 0) / 1000)} s`;
  const stats = Object.assign({messages}, o.message_stats || {});
  const prev = state.overviewPrev;
  const seconds = prev ? (t - prev.t) / 1000 : 0;
  const p = prev ? prev.stats : {};
  $('ov-rate-publish').textContent = rate(stats.publish, p.publish, seconds);
  $('ov-rate-deliver').textContent = rate(stats.deliver_get, p.deliver_get, seconds);
  $('ov-rate-ack').textContent = rate(stats.ack, p.ack, seconds);
  // The queued total goes down as well as up: a signed change.
  $('ov-rate-messages').textContent =
    prev && seconds > 0 ? fmt((messages - p.messages) / seconds) : '-';
  state.overviewPrev = {t, stats};
}

// ---- lists (queues, exchanges, ...) --------------------------------------

function cell(value) {
  if (Array.isArray(value)) return value.join(', ');
  if (value === true) return 'yes';
  if (value === false) return 'no';
  return fmt(value);
}

async function refreshList(spec) {
  const l = state.list;
  const sort = l.sort || spec.sort;
  const q = new URLSearchParams({page: l.page, page_size: l.size, sort,
    sort_reverse: l.reverse, columns: spec.columns.map((c) => c[0]).join(',')});
  if (l.filter) q.set('name', l.filter);
  let data;
  try {
    data = await api(`${spec.path}?${q}`);
  } catch (error) {
    // The list shrank under the page shown (RabbitMQ refuses a page past
    // its end): start again from the first.
    if (error.code !== 'page_out_of_range' || l.page === 1) throw error;
    l.page = 1;
    return refreshList(spec);
  }
  if (Array.isArray(data)) data = pageLocally(data, l, sort); // a list without paging
  const pages = Math.max(1, data.page_count || 1);
  if (l.page > pages) { l.page = pages; return refreshList(spec); }
  $('list-title').textContent = `${spec.title} (${fmt(data.filtered_count)}` +
    (data.filtered_count !== data.total_count ? ` of ${fmt(data.total_count)})` : ')');
  $('list-page').textContent = `page ${l.page} of ${pages}`;
  $('list-prev').disabled = l.page <= 1;
  $('list-next').disabled = l.page >= pages;
  const head = el('tr');
  for (const [key, label] of spec.columns) {
    const cls = 'sortable' + (key === sort ? (l.reverse ? ' sorted-desc' : ' sorted-asc') : '');
    head.append(el('th', {class: cls, 'data-key': key, onclick: () => sortBy(key)}, label));
  }
  // Only the page is drawn: 10,000 queues are 200 pages of 50 rows.
  const body = document.createDocumentFragment();
  for (const item of data.items) {
    const tr = el('tr');
    for (const [key, , kind] of spec.columns)
      tr.append(el('td', kind ? {class: kind} : {}, cell(item[key])));
    body.append(tr);
  }
  $('list').tHead.replaceChildren(head);
  $('list').tBodies[0].replaceChildren(body);
}

// RabbitMQ's paging, done here for a list the API answers whole.
function pageLocally(items, l, sort) {
  const filtered = l.filter ? items.filter((i) => String(i.name).includes(l.filter)) : items;
  filtered.sort((a, b) => {
    const x = a[sort], y = b[sort];
    const c = typeof x === 'number' && typeof y === 'number' ? x - y
      : String(x ?? '').localeCompare(String(y ?? ''));
    return l.reverse ? -c : c;
  });
  const start = (l.page - 1) * l.size;
  return {items: filtered.slice(start, start + l.size), filtered_count: filtered.length,
    total_count: items.length, page_count: Math.ceil(filtered.length / l.size)};
}

function sortBy(key) {
  const l = state.list;
  const current = l.sort || LISTS[state.view].sort;
  l.reverse = current === key ? !l.reverse : false;
  l.sort = key;
  refresh(true);
}

// ---- the cluster map -----------------------------------------------------

const CENTER = 300, RADIUS = 210, NODE = 34;

function place(brokers) {
  const at = new Map();
  brokers.forEach((b, i) => {
    const angle = -Math.PI / 2 + (2 * Math.PI * i) / brokers.length;
    at.set(b.name, {x: CENTER + RADIUS * Math.cos(angle), y: CENTER + RADIUS * Math.sin(angle)});
  });
  return at;
}

// A curved arrow from a to b, bent to the right so a->b and b->a do not overlap.
function arc(a, b, bend) {
  const mx = (a.x + b.x) / 2, my = (a.y + b.y) / 2;
  const dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1;
  const cx = mx - (dy / len) * bend, cy = my + (dx / len) * bend;
  // Stop at the circles' edges.
  const ux = (cx - a.x), uy = (cy - a.y), ul = Math.hypot(ux, uy) || 1;
  const vx = (cx - b.x), vy = (cy - b.y), vl = Math.hypot(vx, vy) || 1;
  const sx = a.x + (ux / ul) * NODE, sy = a.y + (uy / ul) * NODE;
  const ex = b.x + (vx / vl) * (NODE + 6), ey = b.y + (vy / vl) * (NODE + 6);
  return {d: `M${sx},${sy} Q${cx},${cy} ${ex},${ey}`, lx: (sx + 2 * cx + ex) / 4,
    ly: (sy + 2 * cy + ey) / 4};
}

// The failovers of the last RECENT_MS: {from, to, queues} per pair of
// brokers, and the brokers that went down, from the recent events.
function recentFailovers(events) {
  const pairs = new Map(), down = new Set();
  const now = events ? events.now_ms : 0;
  for (const e of (events && events.events) || []) {
    if (now - e.time_ms > RECENT_MS) continue;
    if (e.event === 'broker_state' && e.to === 'down') down.add(e.broker);
    if (e.event !== 'primary_moved' || !isFailover(e) || !e.from || !e.to) continue;
    const key = `${e.from}\u0000${e.to}`;
    const p = pairs.get(key) || {from: e.from, to: e.to, queues: 0};
    p.queues++;
    pairs.set(key, p);
  }
  return {pairs: [...pairs.values()], down};
}

function isFailover(e) { return e.reason === 'failover' || e.reason === 'forget'; }

function drawRing(cluster, placement, queue, events) {
  const ring = $('ring');
  const brokers = cluster.brokers || [];
  const at = place(brokers);
  const parts = [svg('circle', {class: 'ring-line', cx: CENTER, cy: CENTER, r: RADIUS})];
  const defs = svg('defs');
  for (const [id, color] of [['in-sync', '#2e9d4c'], ['catching-up', '#e08a00'],
    ['move', '#1a5fb4'], ['pick', '#1a5fb4'], ['failover', '#b3261e']]) {
    const m = svg('marker', {id: 'arrow-' + id, viewBox: '0 0 10 10', refX: 5, refY: 5,
      markerWidth: 5, markerHeight: 5, orient: 'auto-start-reverse'});
    m.append(svg('path', {d: 'M0,0 L10,5 L0,10 z', fill: color}));
    defs.append(m);
  }
  parts.push(defs);
  const recent = recentFailovers(events);
  const promoted = new Set(recent.pairs.map((f) => f.to));
  const counted = queue ? [] : placement.pairs || [];
  const most = Math.max(1, ...counted.map((p) => p.queues));
  for (const p of counted) {
    const a = at.get(p.primary), b = at.get(p.backup);
    if (!a || !b) continue;
    const kind = p.in_sync === p.queues ? 'in-sync' : 'catching-up';
    const c = arc(a, b, 40);
    const width = 1.5 + 6 * Math.sqrt(p.queues / most);
    // A pair whose primary took queues over in a recent failover: marked.
    const g = svg('g', {class: 'pair-group' + (promoted.has(p.primary) ? ' failed-over' : ''),
      'data-primary': p.primary,
      'data-backup': p.backup, 'data-queues': p.queues, 'data-in-sync': p.in_sync});
    g.append(svg('path', {class: `pair ${kind}`, d: c.d, 'stroke-width': width,
      'marker-end': `url(#arrow-${kind})`}));
    const label = p.in_sync === p.queues ? fmt(p.queues) : `${fmt(p.in_sync)}/${fmt(p.queues)}`;
    g.append(svg('text', {x: c.lx, y: c.ly, 'text-anchor': 'middle'}, label));
    parts.push(g);
  }
  for (const m of (queue ? [] : cluster.moves || [])) {
    const a = at.get(m.from), b = at.get(m.to);
    if (a && b) parts.push(svg('path', {class: 'move', d: arc(a, b, -60).d,
      'marker-end': 'url(#arrow-move)', 'data-queue': m.queue}));
  }
  // Failovers as they happen: from the broker that failed to the one that
  // took its queues, for RECENT_MS.
  for (const f of (queue ? [] : recent.pairs)) {
    const a = at.get(f.from), b = at.get(f.to);
    if (!a || !b) continue;
    const g = svg('g', {class: 'failover-group', 'data-from': f.from, 'data-to': f.to,
      'data-queues': f.queues});
    const c = arc(a, b, -25);
    g.append(svg('path', {class: 'failover', d: c.d, 'marker-end': 'url(#arrow-failover)'}));
    g.append(svg('text', {class: 'failover-label', x: c.lx, y: c.ly, 'text-anchor': 'middle'},
      `failover ${fmt(f.queues)}`));
    parts.push(g);
  }
  if (queue) parts.push(...drawQueue(queue, at));
  for (const b of brokers) {
    const p = at.get(b.name);
    const marks = (b.name === cluster.leader ? ' leader' : '') +
      (recent.down.has(b.name) ? ' failed' : '') + (promoted.has(b.name) ? ' promoted' : '');
    const g = svg('g', {class: 'broker' + marks,
      'data-name': b.name, 'data-state': b.state, 'data-primaries': b.primaries,
      'data-backups': b.backups});
    g.append(svg('title', {}, `${b.name}: ${b.state}, AMQP ${b.amqp}`));
    g.append(svg('circle', {class: `state ${b.state}`, cx: p.x, cy: p.y, r: NODE}));
    g.append(svg('text', {class: 'on-state', x: p.x, y: p.y + 5, 'text-anchor': 'middle'},
      b.state));
    const below = p.y > CENTER + 1 ? NODE + 18 : -(NODE + 24);
    g.append(svg('text', {x: p.x, y: p.y + below, 'text-anchor': 'middle',
      'font-weight': 'bold'}, b.name + (b.name === cluster.leader ? ' (leader)' : '')));
    g.append(svg('text', {x: p.x, y: p.y + below + 15, 'text-anchor': 'middle'},
      `${fmt(b.primaries)} primaries, ${fmt(b.backups)} backups`));
    parts.push(g);
  }
  ring.replaceChildren(...parts);
}

// One queue's placement: its primary circled, arrows to its backups.
function drawQueue(q, at) {
  const out = [];
  const a = at.get(q.primary);
  if (!a) return out;
  out.push(svg('circle', {class: 'highlight', cx: a.x, cy: a.y, r: NODE + 8}));
  for (const b of q.backups || []) {
    const p = at.get(b);
    if (!p) continue;
    const kind = (q.in_sync || []).includes(b) ? 'in-sync' : 'catching-up';
    out.push(svg('path', {class: `pair ${kind}`, d: arc(a, p, 40).d, 'stroke-width': 4,
      'marker-end': `url(#arrow-${kind})`, 'data-backup': b}));
  }
  return out;
}

function fillTable(id, rows) {
  const body = document.createDocumentFragment();
  for (const r of rows) {
    const tr = el('tr');
    for (const v of r) tr.append(el('td', typeof v === 'number' ? {class: 'num'} : {}, fmt(v)));
    body.append(tr);
  }
  $(id).tBodies[0].replaceChildren(body);
}

// The search goes through GET /api/queues (a page sorted by name: the server
// cuts it before it asks the page's primaries for counts): asked again every
// LIST_REFRESH_MS, not with every redraw of the ring.
async function findQueues() {
  if (!state.search) { $('cl-found').replaceChildren(); return null; }
  let found = state.found;
  if (!found || found.search !== state.search || Date.now() - found.at >= LIST_REFRESH_MS) {
    const q = new URLSearchParams({page: 1, page_size: 10, name: state.search,
      columns: 'vhost,name,primary,backups,in_sync,available'});
    found = Object.assign(await api('/api/queues?' + q), {search: state.search,
      at: Date.now()});
    state.found = found;
  }
  const items = found.items || [];
  $('cl-found').replaceChildren(...items.map((i) => el('li', {onclick: () => {
    state.picked = {vhost: i.vhost, name: i.name};
    refresh(true);
  }}, `${i.name} (${i.vhost})`)));
  if (found.filtered_count > items.length)
    $('cl-found').append(el('li', {class: 'sub'}, `... ${fmt(found.filtered_count)} match`));
  const pick = state.picked;
  return items.find((i) => pick && i.vhost === pick.vhost && i.name === pick.name) || items[0];
}

// One line of the recent events, in words.
function eventText(e) {
  const q = e.queue !== undefined ? `${e.queue} (${e.vhost})` : '';
  switch (e.event) {
    case 'primary_moved':
      return `${q}: primary ${e.from || '?'} \u2192 ${e.to || '?'}` +
        (isFailover(e) ? ' (FAILOVER)' : '');
    case 'move_started': return `${q}: move ${e.from || '?'} \u2192 ${e.to} started`;
    case 'move_ended': return `${q}: move to ${e.to} ended`;
    case 'available': return `${q}: available again`;
    case 'unavailable': return `${q}: UNAVAILABLE`;
    case 'broker_state':
      return `broker ${e.broker}: ${e.from} \u2192 ${e.to}` +
        (e.silence_ms ? ` (silent ${fmt(e.silence_ms)} ms)` : '');
    default: return `broker ${e.broker}: ${e.event.replace('broker_', '')}`;
  }
}

function drawEvents(events) {
  const all = (events && events.events) || [];
  const now = events ? events.now_ms : 0;
  const shown = all.slice(-EVENTS_SHOWN).reverse(); // newest first
  $('cl-events-count').textContent = all.length ? `(last ${shown.length} of ${all.length})` : '';
  $('cl-events').replaceChildren(...shown.map((e) => {
    const attrs = {'data-seq': e.seq, 'data-event': e.event, 'data-reason': e.reason,
      class: e.event + (isFailover(e) && e.event === 'primary_moved' ? ' failover' : '') +
        (e.event === 'broker_state' ? ' state-' + e.to : '') +
        (now - e.time_ms <= RECENT_MS ? ' recent' : '')};
    for (const k of ['broker', 'vhost', 'queue', 'from', 'to'])
      if (e[k] !== undefined) attrs['data-' + k] = e[k];
    const at = new Date(e.time_ms).toISOString().slice(11, 19);
    return el('li', attrs, el('span', {class: 'when'}, at), ' ', eventText(e), ' ',
      el('span', {class: 'why'}, e.reason));
  }));
}

async function refreshCluster() {
  let cluster, placement, events;
  try {
    [cluster, placement, events] = await Promise.all([api('/api/cluster'),
      api('/api/cluster/placement'), api('/api/cluster/events')]);
  } catch (e) {
    if (e.message.includes('404')) { // one broker alone: /api/cluster is not served
      $('cl-summary').textContent = '(not clustered)';
      $('ring').replaceChildren();
      return;
    }
    throw e;
  }
  const queue = await findQueues();
  $('cl-summary').textContent = `(answered by ${cluster.self}; leader ${cluster.leader ||
    'none'}, map epoch ${cluster.epoch}, ${fmt(cluster.queues)} queues, ` +
    `${fmt(placement.unavailable)} unavailable)`;
  $('cl-queue').replaceChildren(queue ? el('p', {},
    `${queue.name} (${queue.vhost}): primary ${queue.primary}, backups ` +
    `${(queue.backups || []).join(', ') || 'none'}; in sync ` +
    `${(queue.in_sync || []).join(', ') || 'none'}` +
    (queue.available === false ? '; UNAVAILABLE' : '')) : '');
  drawRing(cluster, placement, queue, events);
  drawEvents(events);
  fillTable('cl-brokers', (cluster.brokers || []).map((b) =>
    [b.name, b.state, b.primaries, b.backups, b.unavailable]));
  fillTable('cl-pairs', (placement.pairs || []).map((p) =>
    [p.primary, p.backup, p.queues, p.in_sync, p.queues - p.in_sync]));
  fillTable('cl-moves', (cluster.moves || []).map((m) =>
    [`${m.queue} (${m.vhost})`, m.kind, m.from, m.to, m.phase]));
}

// ---- wiring ----------------------------------------------------------------

function wire() {
  $('login').addEventListener('submit', (e) => {
    e.preventDefault();
    const pair = `${$('login-user').value}:${$('login-password').value}`;
    logIn('Basic ' + btoa(unescape(encodeURIComponent(pair))));
  });
  $('logout').addEventListener('click', () => showLogin(''));
  window.addEventListener('hashchange', () => {
    if (state.auth) show(location.hash.replace(/^#/, '').split('&')[0]);
  });
  let typing = null;
  $('list-filter').addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.list.filter = $('list-filter').value;
      state.list.page = 1;
      refresh(true);
    }, 250);
  });
  $('list-page-size').addEventListener('change', () => {
    state.list.size = Number($('list-page-size').value);
    state.list.page = 1;
    refresh(true);
  });
  $('list-prev').addEventListener('click', () => { state.list.page--; refresh(true); });
  $('list-next').addEventListener('click', () => { state.list.page++; refresh(true); });
  $('cl-search').addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.search = $('cl-search').value.trim();
      state.picked = null;
      refresh(true);
    }, 250);
  });
  setInterval(() => refresh(false), REFRESH_MS);
}

wire();
takeFragmentLogin();
const saved = sessionStorage.getItem(AUTH_KEY);
if (saved) logIn(saved);
else showLogin('');
