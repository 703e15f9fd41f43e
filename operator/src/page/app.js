// poolgate status page: reads /api/status (and /api/keys while that view is open) every 2 s and
// updates the tables in place. Every value reaches the DOM through textContent, never as markup.
'use strict';

(function () {
  const REFRESH_MS = 2000;
  const STATUS_NAMES = {
    active: 'active',
    disabled: 'disabled',
    soft_blocked: 'soft-blocked',
    hard_blocked: 'hard-blocked',
    confirming: 'confirming',
    breaker_open: 'breaker open',
    retired: 'retired',
    error: 'error',
  };
  const PERIODS = ['day', 'week', 'month', 'total'];

  let view = window.location.hash === '#keys' ? 'keys' : 'accounts';
  let timer = null;
  let lastGood = null;

  const $ = (id) => document.getElementById(id);

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // A class name from a value the server sends: only its letters, digits, '_' and '-'.
  function token(value) {
    return String(value).replace(/[^a-z0-9_-]/gi, '');
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return '';
    let s = Math.max(0, Math.round(ms / 1000));
    const d = Math.floor(s / 86400);
    s -= d * 86400;
    const h = Math.floor(s / 3600);
    s -= h * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    if (d > 0) return d + 'd ' + h + 'h';
    if (h > 0) return h + 'h ' + String(m).padStart(2, '0') + 'm';
    if (m > 0) return m + 'm ' + String(s).padStart(2, '0') + 's';
    return s + 's';
  }

  function usd(value) {
    return '$' + Number(value).toFixed(2);
  }

  function count(value) {
    return Number(value).toLocaleString('en-US');
  }

  function clock(ms) {
    return new Date(ms).toLocaleTimeString('en-GB', { hour12: false });
  }

  // A bar: `used` of `limit` (a share when limit is 1), with its label beside it.
  function bar(used, limit, label) {
    const share = limit > 0 ? used / limit : 0;
    const wrap = el('div', 'meter');
    const track = el('div', 'bar');
    const level = el('span', 'fill');
    // CSSOM, not a style attribute: the page's CSP allows no inline style markup.
    level.style.width = Math.min(100, Math.max(0, share * 100)).toFixed(1) + '%';
    if (share >= 1) level.classList.add('full');
    else if (share >= 0.8) level.classList.add('warn');
    track.appendChild(level);
    wrap.appendChild(track);
    wrap.appendChild(el('span', 'label', label));
    return wrap;
  }

  function fill(cell, ...nodes) {
    cell.replaceChildren(...nodes);
  }

  function limited(used, limit, format, unknownText) {
    if (used === null || used === undefined) {
      return el('span', 'muted', limit > 0 ? unknownText + ' / ' + format(limit) : unknownText);
    }
    if (limit > 0) return bar(used, limit, format(used) + ' / ' + format(limit));
    return el('span', null, format(used) + ' (no limit)');
  }

  function windowLine(w) {
    const line = el('div', 'window');
    const name = w.scope && w.scope !== 'account' ? w.kind + ' ' + w.scope : w.kind;
    line.appendChild(el('span', 'wname', name));
    if (w.utilization === null || w.utilization === undefined) {
      line.appendChild(el('span', 'wstatus status-' + token(w.status), w.status));
    } else {
      line.appendChild(bar(w.utilization, 1, Math.round(w.utilization * 100) + '%'));
    }
    const when = w.remaining_ms > 0 ? 'resets in ' + duration(w.remaining_ms) : 'reset passed';
    line.appendChild(el('span', 'wmeta', when + ' · read ' + duration(w.age_ms) + ' ago'));
    return line;
  }

  const ACCOUNT_FIELDS = [
    'name', 'group', 'platform', 'status', 'leases', 'rpm', 'spend', 'windows',
    'block-reason', 'block-left',
  ];

  function accountRow(tbody, id) {
    let row = tbody.querySelector('tr[data-account-id="' + Number(id) + '"]');
    if (row) return row;
    row = el('tr');
    row.dataset.accountId = String(id);
    for (const field of ACCOUNT_FIELDS) {
      const cell = el('td');
      cell.dataset.field = field;
      row.appendChild(cell);
    }
    return row;
  }

  function cell(row, field) {
    return row.querySelector('td[data-field="' + field + '"]');
  }

  function renderAccount(row, a) {
    row.dataset.status = token(a.status);
    const name = el('div', 'name', a.name);
    const sub = el('div', 'sub', '#' + a.id + (a.credential_masked ? ' · ' + a.credential_masked : ''));
    const nameNodes = [name, sub];
    if (a.email) nameNodes.push(el('div', 'sub identity', a.email + (a.plan ? ' · ' + a.plan : '')));
    fill(cell(row, 'name'), ...nameNodes);
    fill(cell(row, 'group'), document.createTextNode(a.group));
    const platformNodes = [document.createTextNode(a.platform)];
    if (a.serves && a.serves.length) platformNodes.push(el('div', 'sub serves', a.serves.join(' · ')));
    fill(cell(row, 'platform'), ...platformNodes);
    const badge = el('span', 'badge status-' + token(a.status), STATUS_NAMES[a.status] || a.status);
    const statusNodes = [badge];
    if (a.status_reason) statusNodes.push(el('div', 'sub', a.status_reason));
    if (a.token_expires_at_ms > 0 && !a.refreshable && a.credential_kind !== 'api_key') {
      // Nothing refreshes it: flagged ahead of its expiry.
      const left = a.token_expires_at_ms - Date.now();
      const soon = left < 14 * 86400000;
      statusNodes.push(el('div', soon ? 'sub expiring' : 'sub',
        left > 0 ? 'token expires in ' + duration(left) + ', no refresh: sign in again before'
          : 'token expired: sign in again'));
    }
    const subscription = a.credential_kind === 'oauth' || a.credential_kind === 'chatgpt_oauth' || !a.credential_kind;
    if (subscription && (a.status === 'error' || (a.token_expires_at_ms > 0 && !a.refreshable))) {
      // Its refresh was refused: signing it in again brings it back, in place.
      const again = el('button', 'again', 'Sign in again');
      again.type = 'button';
      again.dataset.accountId = String(Number(a.id));
      again.addEventListener('click', () => openSignIn(Number(a.id), a.platform === 'openai' ? 'chatgpt' : 'claude'));
      statusNodes.push(again);
    }
    fill(cell(row, 'status'), ...statusNodes);
    fill(cell(row, 'leases'), limited(a.leases, a.concurrency_limit, count, 'unknown'));
    fill(cell(row, 'rpm'), limited(a.rpm_used, a.rpm_limit, count, '–'));
    fill(cell(row, 'spend'), limited(a.session_spend_usd, a.session_window_limit_usd, usd, '–'));
    const windows = (a.windows || []).map(windowLine);
    fill(cell(row, 'windows'), ...(windows.length ? windows : [el('span', 'muted', 'none reported')]));
    fill(cell(row, 'block-reason'), document.createTextNode(a.block_reason || ''));
    fill(cell(row, 'block-left'), document.createTextNode(a.block_left_ms > 0 ? duration(a.block_left_ms) : ''));
  }

  function renderStatus(status) {
    const admission = $('admission');
    admission.textContent = status.admission;
    admission.className = 'state state-' + token(status.admission);
    const replicas = (status.admission_replicas || []).map(
      (r) => r.id + ': ' + r.state + (r.report_age_ms !== null && r.report_age_ms !== undefined
        ? ' (' + duration(r.report_age_ms) + ' ago)' : ''));
    admission.title = replicas.length ? replicas.join('\n') : 'no replica detail';
    $('policy').textContent = status.failure_policy;
    const accounts = status.accounts || [];
    const serving = accounts.filter((a) => a.status === 'active').length;
    $('counts').textContent = serving + ' of ' + accounts.length + ' active';
    $('updated').textContent = clock(status.generated_at_ms);

    const tbody = $('accounts');
    const keep = new Set();
    accounts.forEach((a, index) => {
      const row = accountRow(tbody, a.id);
      renderAccount(row, a);
      keep.add(row);
      if (tbody.children[index] !== row) tbody.insertBefore(row, tbody.children[index] || null);
    });
    for (const row of Array.from(tbody.children)) {
      if (!keep.has(row)) row.remove();
    }
    $('no-accounts').hidden = accounts.length > 0;
  }

  function budgets(key) {
    const nodes = [];
    for (const period of PERIODS) {
      const budget = Number(key['budget_' + period + '_usd'] || 0);
      if (budget <= 0) continue;
      const usage = (key.usage || []).find((u) => u.period === period);
      const spent = usage ? usage.cost_usd : 0;
      const line = el('div', 'budget');
      line.appendChild(el('span', 'wname', period));
      line.appendChild(bar(spent, budget, usd(spent) + ' / ' + usd(budget)));
      nodes.push(line);
    }
    return nodes.length ? nodes : [el('span', 'muted', 'no budget')];
  }

  function limits(key) {
    const parts = [];
    if (key.concurrency_limit > 0) parts.push(key.concurrency_limit + ' at once');
    if (key.tpm_limit > 0) parts.push(count(key.tpm_limit) + ' tokens/min');
    if (key.user_rpm_limit > 0) parts.push(key.user_rpm_limit + ' rpm per user');
    return parts.length ? parts.join(' · ') : 'none';
  }

  function renderKeys(answer) {
    const usage = new Map((answer.usage.keys || []).map((u) => [u.api_key_id, u]));
    const tbody = $('keys');
    const rows = answer.keys.filter((k) => k.status !== 'revoked').map((k) => {
      const u = usage.get(k.id) || { requests: 0, input_tokens: 0, output_tokens: 0, cost_usd: 0 };
      const row = el('tr');
      row.dataset.keyId = String(k.id);
      const cells = [
        [el('div', 'name', k.name), el('div', 'sub', '#' + k.id)],
        [document.createTextNode(k.user)],
        [document.createTextNode(k.group)],
        [el('span', 'badge status-' + token(k.status), k.status)],
        [document.createTextNode(count(u.requests))],
        [document.createTextNode(count(u.input_tokens) + ' / ' + count(u.output_tokens))],
        [document.createTextNode(usd(u.cost_usd))],
        budgets(k),
        [document.createTextNode(limits(k))],
      ];
      for (const nodes of cells) {
        const td = el('td');
        td.replaceChildren(...nodes);
        row.appendChild(td);
      }
      return row;
    });
    tbody.replaceChildren(...rows);
    $('no-keys').hidden = rows.length > 0;
  }

  async function fetchJson(path) {
    const response = await fetch(path, {
      credentials: 'same-origin',
      cache: 'no-store',
      headers: { accept: 'application/json' },
    });
    if (response.status === 401) {
      // The session ended (expired, logged out, token rotated): back to the login form.
      window.location.reload();
      throw new Error('session ended');
    }
    let body = null;
    try {
      body = await response.json();
    } catch (e) {
      body = null;
    }
    if (!response.ok) {
      const message = body && body.error ? body.error.message : 'HTTP ' + response.status;
      throw new Error(message);
    }
    return body;
  }

  function problem(message) {
    const node = $('problem');
    if (!message) {
      node.hidden = true;
      node.textContent = '';
      return;
    }
    const since = lastGood ? ' (showing what was read at ' + clock(lastGood) + ')' : '';
    node.textContent = 'Cannot refresh: ' + message + since;
    node.hidden = false;
  }

  async function refresh() {
    try {
      const answer = await fetchJson('/api/status');
      renderStatus(answer.status);
      if (view === 'keys') renderKeys(await fetchJson('/api/keys'));
      lastGood = Date.now();
      problem(null);
    } catch (error) {
      problem(error.message);
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      await refresh();
      schedule();
    }, REFRESH_MS);
  }

  function show(next) {
    view = next;
    for (const tab of document.querySelectorAll('[role=tab]')) {
      tab.setAttribute('aria-selected', String(tab.dataset.view === view));
    }
    $('view-accounts').hidden = view !== 'accounts';
    $('view-keys').hidden = view !== 'keys';
    history.replaceState(null, '', view === 'keys' ? '#keys' : window.location.pathname);
  }

  // ---- Add account / Sign in again: the flows of the CLI's `login`, run by the server ----

  let signIn = null;

  function openSignIn(accountId, subscription) {
    const panel = $('sign-in');
    panel.hidden = false;
    $('sign-in-account').value = accountId ? String(accountId) : '';
    $('sign-in-title').textContent = accountId ? 'Sign account #' + accountId + ' in again' : 'Add account';
    $('sign-in-subscription').value = subscription || 'claude';
    $('sign-in-name').disabled = Boolean(accountId);
    $('sign-in-group').disabled = Boolean(accountId);
    $('sign-in-step').hidden = true;
    $('sign-in-result').textContent = '';
    signIn = null;
  }

  async function post(path, body) {
    const response = await fetch(path, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => null);
    if (!response.ok) {
      const message = answer && answer.error && answer.error.message ? answer.error.message : 'HTTP ' + response.status;
      throw new Error(message);
    }
    return answer;
  }

  async function startSignIn(event) {
    event.preventDefault();
    const accountId = Number($('sign-in-account').value) || null;
    const body = { subscription: $('sign-in-subscription').value, account_id: accountId };
    if (!accountId) {
      body.name = $('sign-in-name').value.trim() || null;
      body.group = $('sign-in-group').value.trim() || null;
    }
    $('sign-in-result').textContent = '';
    try {
      const started = await post('/api/sign-in/start', body);
      if (!/^https?:\/\//.test(started.url)) throw new Error('the server gave no sign-in address');
      signIn = started;
      const link = $('sign-in-url');
      link.href = started.url;
      link.textContent = started.url;
      $('sign-in-instructions').textContent = started.paste === 'code'
        ? 'Open the address below, sign in with the Claude account, and paste the code the page shows.'
        : 'Open the address below and sign in with the ChatGPT account. The browser then goes to a localhost address that shows an error: copy that whole address and paste it here.';
      $('sign-in-paste-label').textContent = started.paste === 'code' ? 'Code' : 'Address';
      $('sign-in-pasted').value = '';
      $('sign-in-step').hidden = false;
    } catch (error) {
      $('sign-in-result').textContent = error.message;
    }
  }

  async function finishSignIn(event) {
    event.preventDefault();
    if (!signIn) return;
    const pasted = $('sign-in-pasted').value.trim();
    try {
      const done = await post('/api/sign-in/finish', { id: signIn.id, pasted: pasted });
      const a = done.account;
      const who = a.email ? ' (' + a.email + (a.plan ? ', ' + a.plan : '') + ')' : '';
      $('sign-in-result').textContent = (done.created ? 'Created account #' : 'Signed in again: account #') + a.id + ' ' + a.name + who;
      $('sign-in-step').hidden = true;
      await refresh();
    } catch (error) {
      $('sign-in-result').textContent = error.message;
    } finally {
      // A sign-in is used once, whatever its end: a new attempt starts again.
      signIn = null;
      $('sign-in-pasted').value = '';
    }
  }

  function start() {
    $('add-account').addEventListener('click', () => openSignIn(null, 'claude'));
    $('sign-in-cancel').addEventListener('click', () => { $('sign-in').hidden = true; signIn = null; });
    $('sign-in-start').addEventListener('submit', startSignIn);
    $('sign-in-finish').addEventListener('submit', finishSignIn);
    for (const tab of document.querySelectorAll('[role=tab]')) {
      tab.addEventListener('click', async () => {
        show(tab.dataset.view);
        await refresh();
        schedule();
      });
    }
    show(view);
    refresh().then(schedule);
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
