// Chat page: streams answers over a WebSocket. User text is only ever written with
// textContent; an answer is rendered as Markdown by markdown.js (raw HTML off, then
// DOMPurify), at most once per animation frame however fast its chunks arrive.
(() => {
  'use strict';

  const $ = (id) => document.getElementById(id);
  const els = {
    prompt: $('prompt'), send: $('send'), stop: $('stop'), form: $('composer'),
    messages: $('messages'), conversations: $('conversations'), newChat: $('new-chat'),
    connection: $('connection'), connectionLabel: $('connection-label'),
    health: $('health-banner'), healthDetail: $('health-detail'),
    banners: $('banners'), counter: $('char-count'), editHint: $('edit-hint'),
    app: document.querySelector('.app'), sidebarToggle: $('sidebar-toggle'), announcer: $('announcer'),
    search: $('search'), tools: $('conversation-tools'), title: $('conversation-title'),
    renameForm: $('rename-form'), renameInput: $('rename-input'), renameCancel: $('rename-cancel'),
    rename: $('rename'), remove: $('delete'), exportMd: $('export-md'), exportJson: $('export-json'),
  };

  // finish_reason -> data-state and badge text.
  const FINISH = {
    eos: { state: 'done', badge: '' },
    stop_string: { state: 'done', badge: '' },
    length: { state: 'done', badge: 'Cut off (token limit)' },
    cancelled: { state: 'cancelled', badge: 'Stopped' },
    invalid: { state: 'invalid', badge: 'Invalid answer' },
    moderated: { state: 'retracted', badge: 'Withdrawn' },
    cut: { state: 'done', badge: 'Cut short' }, // at a loop or an invented turn: `reason` says which
  };
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 8000;
  const PING_MS = 25000;

  const config = readConfig();
  const state = {
    ws: null, backoff: BACKOFF_MIN_MS, pingTimer: null, healthTimer: null,
    ready: false, conversation: config.conversation,
    running: null, // the one live answer, if any
    editing: null, // {answer}: the composer holds the last prompt, to replace that answer
    answers: new Map(), // request_id -> answer
    counter: 0,
  };
  // Chunks received vs Markdown renders done, for the page's tests and the figure in docs/using.md.
  const renderStats = { chunks: 0, renders: 0 };
  window.__chatRenderStats = renderStats;

  function toId(value) { return value == null || value === '' ? null : Number(value); }

  function readConfig() {
    let cfg = null;
    try { cfg = JSON.parse($('chat-config')?.textContent || 'null'); } catch { cfg = null; }
    cfg = cfg || {};
    const urlId = Number(new URLSearchParams(location.search).get('c')) || null;
    return {
      maxPromptChars: Number(cfg.maxPromptChars) || Number(els.prompt.dataset.maxPromptChars) || 4000,
      conversation: toId('conversation' in cfg ? cfg.conversation : urlId),
      wsPath: cfg.wsPath || '/ws/chat/',
    };
  }

  // ---- small DOM helpers -------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text != null) node.textContent = text;
    return node;
  }

  // Sets text and hides the node when there is nothing to show.
  function show(node, text) {
    node.textContent = text || '';
    node.hidden = !text;
  }

  // Keep the list pinned to the bottom only if the reader is already there.
  function keepScrolled(update) {
    const m = els.messages;
    const nearBottom = m.scrollHeight - m.scrollTop - m.clientHeight < 80;
    update();
    if (nearBottom) m.scrollTop = m.scrollHeight;
  }

  function secs(ms) { return (ms / 1000).toFixed(2); }

  function formatMetrics({ firstMs, lastMs, tokens, tps }) {
    const parts = [];
    if (typeof firstMs === 'number') parts.push(`first character ${secs(firstMs)} s`);
    if (typeof lastMs === 'number') parts.push(`last ${secs(lastMs)} s`);
    if (typeof tokens === 'number') parts.push(`${tokens} ${tokens === 1 ? 'token' : 'tokens'}`);
    if (typeof tps === 'number') parts.push(`${tps.toFixed(1)} tok/s`);
    return parts.join(' · ');
  }

  function withdrawnText(reason) {
    return reason ? `Answer withdrawn: ${reason}` : 'Answer withdrawn';
  }

  // Python counts code points, so count them here too (not UTF-16 units).
  function charCount(text) { return [...text].length; }

  function showBanner(message, code) {
    const banner = el('div', 'banner error');
    banner.setAttribute('role', 'alert');
    banner.append(el('span', 'banner-text', message));
    if (code) banner.append(el('small', 'code', code));
    const close = el('button', 'banner-close', '×');
    close.type = 'button';
    close.setAttribute('aria-label', 'Dismiss');
    close.addEventListener('click', () => banner.remove());
    banner.append(close);
    els.banners.append(banner);
    while (els.banners.children.length > 3) els.banners.firstElementChild.remove();
  }

  // ---- message elements --------------------------------------------------

  function buildUser(text) {
    const root = el('article', 'message user');
    const actions = el('div', 'actions');
    const edit = actionButton('edit-prompt', 'Edit', 'Edit this message and send it again');
    edit.hidden = true;
    actions.append(edit);
    root.append(el('div', 'meta', 'You'), el('div', 'text', text), actions);
    root.chatPrompt = text;
    return root;
  }

  // A regenerated answer or an edited prompt keeps what it replaced, marked as an earlier version.
  function markSuperseded(node) {
    node.classList.add('superseded');
    const meta = node.querySelector('.meta');
    if (meta && !meta.querySelector('.earlier')) meta.append(el('span', 'badge earlier', 'Earlier version'));
  }

  function actionButton(className, label, title) {
    const button = el('button', `action ${className}`, label);
    button.type = 'button';
    button.title = title;
    return button;
  }

  function buildAnswer() {
    const root = el('article', 'message assistant');
    const meta = el('div', 'meta');
    const parts = {
      badge: el('span', 'badge'),
      queue: el('div', 'queue'),
      status: el('div', 'status'),
      text: el('div', 'text markdown'),
      json: el('pre', 'json'),
      valid: el('div', 'json-valid', '✓ Valid against the schema'),
      error: el('div', 'error'),
      metrics: el('div', 'metrics'),
      actions: el('div', 'actions'),
    };
    for (const key of ['badge', 'queue', 'status', 'json', 'valid', 'error', 'metrics']) parts[key].hidden = true;
    const regenerate = actionButton('regenerate', 'Regenerate', 'A new answer to the same prompt');
    regenerate.hidden = true;
    const more = actionButton('continue-answer', 'Continue', 'Write the rest of this answer');
    more.hidden = true;
    parts.actions.append(actionButton('copy-answer', 'Copy', 'Copy the answer as Markdown'), more, regenerate);
    meta.append(el('span', 'role', 'Assistant'), parts.badge);
    root.append(meta, parts.queue, parts.status, parts.text, parts.valid, parts.json, parts.error,
      parts.metrics, parts.actions);
    const answer = { root, parts, text: '', plain: false, renderQueued: false };
    root.chatAnswer = answer;
    return answer;
  }

  function setState(answer, value) { answer.root.dataset.state = value; }

  function renderNow(answer) {
    answer.renderQueued = false;
    renderStats.renders += 1;
    if (answer.plain) answer.parts.text.textContent = answer.text;
    else answer.parts.text.replaceChildren(window.ChatMarkdown.render(answer.text));
  }

  // The text changes per chunk; the DOM at most once per frame.
  function setText(answer, text, { plain = false, now = false } = {}) {
    answer.text = text;
    answer.plain = plain;
    if (now) { renderNow(answer); return; }
    if (answer.renderQueued) return;
    answer.renderQueued = true;
    requestAnimationFrame(() => {
      if (answer.renderQueued) keepScrolled(() => renderNow(answer));
    });
  }

  // A structured answer: shown once, pretty-printed, with the mark that it passed its schema.
  function showJson(answer, value) {
    answer.parts.text.hidden = true;
    show(answer.parts.json, JSON.stringify(value, null, 2));
    answer.parts.valid.hidden = false;
    answer.text = answer.parts.json.textContent;
  }

  function setStatus(answer, text, kind) {
    show(answer.parts.status, text);
    answer.parts.status.dataset.kind = kind || '';
  }

  function showError(answer, msg) {
    const box = answer.parts.error;
    box.replaceChildren(el('span', 'error-message', msg.message || 'Something went wrong.'));
    if (msg.code) box.append(el('small', 'code', msg.code));
    box.hidden = false;
  }

  function renderHistoryMessage(m) {
    if (m.role === 'user') {
      const node = buildUser(m.text || '');
      node.dataset.messageId = m.id;
      if (m.superseded) markSuperseded(node);
      return node;
    }
    const answer = buildAnswer();
    const finish = FINISH[m.finish_reason] || FINISH.eos;
    let value = finish.state;
    let badge = finish.badge;
    if (m.status === 'cancelled') { value = 'cancelled'; badge = 'Stopped'; }
    if (m.status === 'failed') { value = 'error'; badge = 'Failed'; }
    if (m.status === 'streaming') { value = 'streaming'; badge = ''; setStatus(answer, 'Still being written…'); }
    setState(answer, value);
    answer.root.dataset.messageId = m.id;
    answer.messageId = m.id;
    answer.finishReason = m.status === 'done' ? m.finish_reason : m.status;
    if (m.superseded) markSuperseded(answer.root);
    if (value === 'retracted') setText(answer, withdrawnText(''), { plain: true, now: true });
    else setText(answer, m.text || '', { now: true });
    if (value === 'retracted') answer.root.classList.add('withdrawn');
    show(answer.parts.badge, badge);
    if (m.json != null && value !== 'retracted') showJson(answer, m.json);
    if (m.metrics) {
      const x = m.metrics;
      show(answer.parts.metrics, formatMetrics({ firstMs: x.ttft_ms, lastMs: x.total_ms, tokens: x.new_tokens, tps: x.tokens_per_s }));
    }
    return answer.root;
  }

  // ---- composer ----------------------------------------------------------

  function updateControls() {
    const len = charCount(els.prompt.value);
    const over = len > config.maxPromptChars;
    els.counter.textContent = `${len} / ${config.maxPromptChars}`;
    els.counter.classList.toggle('over', over);
    els.prompt.setAttribute('aria-invalid', String(over));
    els.send.disabled = !state.ready || Boolean(state.running) || over;
    els.stop.hidden = !state.running;
    els.stop.disabled = Boolean(state.running?.stopping);
  }

  function autosize() {
    els.prompt.style.height = 'auto';
    els.prompt.style.height = `${Math.min(els.prompt.scrollHeight, 240)}px`;
  }

  function socketOpen() { return state.ws?.readyState === WebSocket.OPEN; }

  function newRequestId() {
    state.counter += 1;
    return `r${state.counter}-${Math.random().toString(36).slice(2, 8)}`;
  }

  // From the composer, or a Regenerate (`text` given); `replace` names the answer it replaces.
  function sendPrompt(text = null, replace = state.editing?.answer.messageId ?? null) {
    const fromComposer = text == null;
    if (fromComposer) text = els.prompt.value;
    if (els.send.disabled || !text.trim()) return;
    if (!socketOpen()) {
      showBanner('Not connected to the server yet. Reconnecting…', 'offline');
      return;
    }
    const answer = buildAnswer();
    answer.requestId = newRequestId();
    answer.prompt = text;
    answer.live = true;
    answer.root.setAttribute('aria-busy', 'true'); // not read out chunk by chunk
    answer.replaces = replace == null ? null : answerNodeOf(replace);
    answer.root.dataset.requestId = answer.requestId;
    setState(answer, 'queued');
    state.answers.set(answer.requestId, answer);
    state.running = answer;
    keepScrolled(() => els.messages.append(buildUser(text), answer.root));
    els.messages.scrollTop = els.messages.scrollHeight;

    answer.t0 = performance.now();
    const frame = { type: 'prompt', request_id: answer.requestId, text, conversation: state.conversation };
    const policy = document.getElementById('policy');
    if (policy && policy.value) frame.policy = policy.value;
    if (replace != null) frame.replace = replace;
    state.ws.send(JSON.stringify(frame));
    if (fromComposer) {
      els.prompt.value = '';
      stopEditing();
    }
    autosize();
    updateLastActions();
    updateControls();
  }

  function answerNodeOf(messageId) {
    return [...els.messages.querySelectorAll('.message.assistant')]
      .find((node) => node.chatAnswer?.messageId === messageId) || null;
  }

  // The rest of an answer cut off at the token limit, written into the same message.
  function continueAnswer(answer) {
    if (state.running || !socketOpen()) return;
    state.answers.delete(answer.requestId);
    answer.requestId = newRequestId();
    answer.live = true;
    answer.root.setAttribute('aria-busy', 'true');
    answer.root.dataset.requestId = answer.requestId;
    answer.parts.badge.hidden = true;
    setState(answer, 'queued');
    state.answers.set(answer.requestId, answer);
    state.running = answer;
    answer.t0 = performance.now();
    answer.tFirst = null;
    answer.started = false;
    state.ws.send(JSON.stringify({ type: 'continue', request_id: answer.requestId, message: answer.messageId }));
    updateLastActions();
    updateControls();
  }

  // Regenerate, Continue and Edit apply to the conversation's last answer only, once it has ended.
  function updateLastActions() {
    for (const button of els.messages.querySelectorAll('.regenerate, .edit-prompt, .continue-answer')) button.hidden = true;
    if (state.running) return;
    const answers = els.messages.querySelectorAll('.message.assistant:not(.superseded)');
    const last = answers[answers.length - 1];
    if (!last || last.chatAnswer?.messageId == null) return;
    last.querySelector('.regenerate').hidden = false;
    last.querySelector('.continue-answer').hidden = last.chatAnswer.finishReason !== 'length';
    const asked = last.previousElementSibling;
    if (asked?.classList.contains('user')) asked.querySelector('.edit-prompt').hidden = false;
  }

  function startEditing(userNode) {
    const answerNode = userNode.nextElementSibling;
    if (!answerNode?.chatAnswer) return;
    state.editing = { answer: answerNode.chatAnswer };
    els.prompt.value = userNode.chatPrompt;
    els.editHint.hidden = false;
    autosize();
    updateControls();
    els.prompt.focus();
  }

  function stopEditing() {
    state.editing = null;
    els.editHint.hidden = true;
  }

  function stopRunning() {
    const answer = state.running;
    if (!answer || !socketOpen()) return;
    answer.stopping = true;
    state.ws.send(JSON.stringify({ type: 'cancel', request_id: answer.requestId }));
    updateControls();
  }

  // Ends the live phase of an answer and frees the composer.
  const ANNOUNCE = {
    done: 'Answer finished.', cancelled: 'Answer stopped.', retracted: 'Answer withdrawn.',
    invalid: 'Answer invalid.', error: 'The answer failed.', lost: 'Connection lost.',
  };

  function finish(answer, value) {
    answer.live = false;
    setState(answer, value);
    // The log region reads the answer once it is no longer busy; the status says how it ended.
    answer.root.setAttribute('aria-busy', 'false');
    els.announcer.textContent = ANNOUNCE[value] || '';
    answer.parts.queue.hidden = true;
    if (state.running === answer) state.running = null;
    updateLastActions();
    updateControls();
  }

  // ---- server events -----------------------------------------------------

  function onAccepted(answer, msg) {
    answer.messageId = msg.message;
    if (answer.replaces) {
      markSuperseded(answer.replaces);
      const asked = answer.replaces.previousElementSibling;
      if (asked?.classList.contains('user')) markSuperseded(asked);
    }
    adoptConversation(msg.conversation, answer);
    onQueued(answer, msg);
  }

  function onQueued(answer, msg) {
    if (answer.started) return; // position no longer matters once text flows
    const ahead = Number(msg.queue_position) || 0;
    if (ahead > 0) {
      setState(answer, 'queued');
      show(answer.parts.queue, `Waiting in queue: ${ahead} ahead`);
    } else {
      setState(answer, 'streaming');
      answer.parts.queue.hidden = true;
    }
  }

  function onChunk(answer, msg) {
    if (answer.retracted) return;
    const piece = typeof msg.text === 'string' ? msg.text : '';
    renderStats.chunks += 1;
    if (piece && answer.tFirst == null) answer.tFirst = performance.now();
    if (!answer.started) {
      answer.started = true;
      answer.parts.queue.hidden = true;
      setStatus(answer, '');
      setState(answer, 'streaming');
    }
    setText(answer, answer.text + piece);
  }

  function onBuffering(answer, msg) {
    answer.parts.queue.hidden = true;
    setState(answer, 'validating');
    setStatus(answer, msg.reason ? `Validating… ${msg.reason}` : 'Validating…', 'validating');
  }

  function onRetract(answer, msg) {
    answer.retracted = true;
    answer.retractReason = msg.reason || '';
    setStatus(answer, '');
    answer.root.classList.add('withdrawn');
    answer.parts.json.hidden = true;
    answer.parts.valid.hidden = true;
    setState(answer, 'retracted');
    setText(answer, withdrawnText(answer.retractReason), { plain: true, now: true });
  }

  // A loop or an invented turn: what was shown is replaced by its good part.
  function onCut(answer, msg) {
    if (typeof msg.text === 'string') keepScrolled(() => setText(answer, msg.text, { now: true }));
  }

  function onDone(answer, msg) {
    const now = performance.now();
    answer.finishReason = msg.finish_reason;
    const info = FINISH[msg.finish_reason] || FINISH.eos;
    let value = info.state;
    if (answer.retracted && value === 'done') value = 'retracted';
    setStatus(answer, '');
    keepScrolled(() => {
      if (value === 'retracted') {
        answer.root.classList.add('withdrawn');
        setText(answer, withdrawnText(answer.retractReason), { plain: true, now: true });
      } else {
        setText(answer, typeof msg.text === 'string' ? msg.text : answer.text, { now: true });
        // A retract followed by e.g. "invalid": keep the reason visible.
        if (answer.retracted) setStatus(answer, withdrawnText(answer.retractReason), 'withdrawn');
        if (msg.json != null) showJson(answer, msg.json);
      }
      // Cancelled by a stopping server, not by the user: say so.
      const badge = msg.reason === 'server_restarting' ? 'Stopped: the server restarted' : info.badge;
      show(answer.parts.badge, [badge, msg.cached ? 'cached' : ''].filter(Boolean).join(' · '));
      answer.parts.badge.title = msg.finish_reason === 'cut' ? `Cut short: ${msg.reason || ''}` : '';
      if (answer.tFirst == null) answer.tFirst = now;
      const m = msg.metrics || {};
      show(answer.parts.metrics, formatMetrics({
        firstMs: answer.tFirst - answer.t0, lastMs: now - answer.t0,
        tokens: m.new_tokens, tps: m.tokens_per_s,
      }));
    });
    answer.messageId = msg.message ?? answer.messageId;
    finish(answer, value);
    refreshConversations();
  }

  function onError(msg) {
    const answer = msg.request_id != null ? state.answers.get(msg.request_id) : null;
    if (!answer) {
      showBanner(msg.message || 'Something went wrong.', msg.code);
      return;
    }
    keepScrolled(() => showError(answer, msg));
    // An error after the answer ended (e.g. a late cancel) must not rewrite its outcome.
    if (answer.live) {
      setStatus(answer, '');
      finish(answer, 'error');
    }
  }

  const HANDLERS = {
    accepted: onAccepted, queued: onQueued, chunk: onChunk,
    buffering: onBuffering, retract: onRetract, cut: onCut, done: onDone,
  };

  function handleEvent(raw) {
    let msg;
    try { msg = JSON.parse(raw); } catch { return; }
    if (!msg || typeof msg !== 'object' || msg.type === 'pong') return;
    if (msg.type === 'error') { onError(msg); return; }
    const handler = HANDLERS[msg.type];
    const answer = state.answers.get(msg.request_id);
    if (handler && answer) handler(answer, msg);
  }

  // ---- connection --------------------------------------------------------

  // The server closes the socket with this code when it stops for a restart (chat/protocol.py).
  const CLOSE_SERVER_RESTARTING = 4012;

  function setConnection(open, restarting = false) {
    els.connection.dataset.state = open ? 'open' : 'closed';
    els.connectionLabel.textContent = open
      ? 'connected'
      : restarting ? 'the server restarted, reconnecting…' : 'reconnecting…';
  }

  function connect() {
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    let ws;
    try {
      ws = new WebSocket(`${scheme}://${location.host}${config.wsPath}`);
    } catch {
      scheduleReconnect();
      return;
    }
    state.ws = ws;
    ws.addEventListener('open', () => {
      state.backoff = BACKOFF_MIN_MS;
      setConnection(true);
      // A restarted server may still be loading its model: ask before enabling Send again.
      pollHealth();
      clearInterval(state.pingTimer);
      state.pingTimer = setInterval(() => {
        if (socketOpen()) state.ws.send(JSON.stringify({ type: 'ping' }));
      }, PING_MS);
    });
    ws.addEventListener('message', (event) => handleEvent(event.data));
    ws.addEventListener('close', (event) => {
      if (state.ws !== ws) return;
      clearInterval(state.pingTimer);
      setConnection(false, event.code === CLOSE_SERVER_RESTARTING);
      state.ready = false; // nothing can be sent until the socket is back and the server is ready
      markRunningLost();
      updateControls();
      scheduleReconnect();
    });
  }

  function scheduleReconnect() {
    setTimeout(connect, state.backoff);
    state.backoff = Math.min(state.backoff * 2, BACKOFF_MAX_MS);
  }

  // The server forgets a request when its socket goes; don't wait for it.
  function markRunningLost() {
    const answer = state.running;
    if (!answer) return;
    setStatus(answer, 'Connection lost', 'lost');
    finish(answer, 'lost');
  }

  // ---- health ------------------------------------------------------------

  async function pollHealth() {
    clearTimeout(state.healthTimer); // one poll loop at a time, however often a socket reopens
    state.healthTimer = null;
    let detail = '';
    try {
      const res = await fetch('/healthz', { cache: 'no-store', headers: { Accept: 'application/json' } });
      if (res.ok) {
        state.ready = true;
        els.health.hidden = true;
        updateControls();
        return;
      }
      const body = await res.json().catch(() => ({}));
      detail = body.detail || body.status || `HTTP ${res.status}`;
    } catch {
      detail = 'server unreachable';
    }
    state.ready = false;
    els.healthDetail.textContent = detail;
    els.health.hidden = false;
    updateControls();
    state.healthTimer = setTimeout(pollHealth, 1000);
  }

  // ---- conversations -----------------------------------------------------

  function conversationItem(c) {
    const li = el('li');
    const a = el('a', '', c.title || 'Untitled chat');
    a.href = `/?c=${c.id}`;
    a.dataset.id = String(c.id);
    if (c.updated_at) a.title = new Date(c.updated_at).toLocaleString();
    li.append(a);
    return li;
  }

  function markCurrent() {
    let current = null;
    for (const a of els.conversations.querySelectorAll('a')) {
      if (Number(a.dataset.id) === state.conversation) {
        a.setAttribute('aria-current', 'page');
        current = a;
      } else a.removeAttribute('aria-current');
    }
    if (current) state.title = current.textContent;
    updateTools();
  }

  function dayLabel(iso) {
    const day = new Date(iso);
    const today = new Date();
    const yesterday = new Date(today);
    yesterday.setDate(today.getDate() - 1);
    if (day.toDateString() === today.toDateString()) return 'Today';
    if (day.toDateString() === yesterday.toDateString()) return 'Yesterday';
    return day.toLocaleDateString(undefined, { weekday: 'short', day: 'numeric', month: 'short', year: 'numeric' });
  }

  // Newest first, under a heading per day (the reader's local day).
  function renderConversationList(list) {
    const items = [];
    let last = null;
    for (const c of list) {
      const label = c.updated_at ? dayLabel(c.updated_at) : '';
      if (label !== last) {
        const heading = el('li', 'day-label', label);
        heading.setAttribute('role', 'presentation');
        items.push(heading);
        last = label;
      }
      items.push(conversationItem(c));
    }
    if (!list.length && els.search.value.trim()) items.push(el('li', 'day-label', 'No chats match.'));
    els.conversations.replaceChildren(...items);
    markCurrent();
  }

  async function refreshConversations() {
    const q = els.search.value.trim();
    try {
      const url = q ? `/api/conversations/?q=${encodeURIComponent(q)}` : '/api/conversations/';
      const res = await fetch(url, { headers: { Accept: 'application/json' } });
      if (!res.ok) return;
      const data = await res.json();
      if (!Array.isArray(data.conversations) || els.search.value.trim() !== q) return;
      renderConversationList(data.conversations);
    } catch { /* the list is a convenience; keep the old one */ }
  }

  // ---- the current conversation: rename, delete, export ---------------------

  function csrfToken() {
    return document.querySelector('input[name="csrfmiddlewaretoken"]')?.value || '';
  }

  function updateTools() {
    const id = state.conversation;
    els.tools.hidden = id == null;
    if (id == null) return;
    els.title.textContent = state.title || 'Untitled chat';
    els.exportMd.href = `/api/conversations/${id}/export?format=markdown`;
    els.exportJson.href = `/api/conversations/${id}/export?format=json`;
  }

  function startRename() {
    els.renameInput.value = state.title || '';
    els.renameForm.hidden = false;
    els.title.hidden = true;
    els.renameInput.focus();
    els.renameInput.select();
  }

  function endRename() {
    els.renameForm.hidden = true;
    els.title.hidden = false;
    els.rename.focus();
  }

  async function conversationRequest(method, body) {
    const res = await fetch(`/api/conversations/${state.conversation}/`, {
      method,
      headers: { 'Content-Type': 'application/json', 'X-CSRFToken': csrfToken(), Accept: 'application/json' },
      body: body == null ? undefined : JSON.stringify(body),
    });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      showBanner(err.message || `The server said ${res.status}.`, err.code || `http_${res.status}`);
    }
    return res;
  }

  async function saveRename(event) {
    event.preventDefault();
    const title = els.renameInput.value.trim();
    if (!title || state.conversation == null) return;
    const res = await conversationRequest('PATCH', { title });
    if (!res.ok) return;
    state.title = (await res.json()).title;
    endRename();
    refreshConversations();
  }

  async function deleteConversation() {
    if (state.conversation == null || state.running) return;
    const title = state.title || 'this chat';
    if (!window.confirm(`Delete “${title}” and all its messages? This cannot be undone.`)) return;
    const res = await conversationRequest('DELETE');
    if (!res.ok) return;
    startNewChat();
    refreshConversations();
  }

  // A first prompt creates the conversation server-side; make the page point at it.
  function adoptConversation(id, answer) {
    if (id == null || state.conversation != null || !answer.root.isConnected) return;
    state.conversation = toId(id);
    state.title = answer.prompt.trim().slice(0, 60);
    history.replaceState({ c: id }, '', `/?c=${id}`);
    if (!els.conversations.querySelector(`a[data-id="${id}"]`)) {
      els.conversations.prepend(conversationItem({ id, title: answer.prompt.trim().slice(0, 60) }));
    }
    markCurrent();
  }

  // mode "prepend" keeps anything the user sent while history was loading.
  async function loadConversation(id, mode = 'replace') {
    let res;
    try {
      res = await fetch(`/api/conversations/${id}/`, { headers: { Accept: 'application/json' } });
    } catch {
      showBanner('Could not load the conversation.', 'network');
      return false;
    }
    if (!res.ok) {
      showBanner(res.status === 404 ? 'That conversation no longer exists.' : 'Could not load the conversation.', `http_${res.status}`);
      return false;
    }
    const data = await res.json();
    if (mode === 'replace') stopEditing();
    const nodes = (data.messages || []).map(renderHistoryMessage);
    state.conversation = toId(data.id ?? id);
    state.title = data.title;
    if (mode === 'prepend') els.messages.prepend(...nodes);
    else els.messages.replaceChildren(...nodes);
    els.messages.scrollTop = els.messages.scrollHeight;
    markCurrent();
    updateLastActions();
    return true;
  }

  function startNewChat() {
    stopEditing();
    setSidebar(false);
    state.conversation = null;
    els.messages.replaceChildren();
    history.pushState({ c: null }, '', '/');
    markCurrent();
    els.prompt.focus();
  }

  function onConversationClick(event) {
    const a = event.target.closest('a[data-id]');
    // Let modified clicks and clicks during a running answer do a normal navigation.
    if (!a || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    if (state.running) return;
    event.preventDefault();
    setSidebar(false);
    const id = Number(a.dataset.id);
    loadConversation(id).then((ok) => { if (ok) history.pushState({ c: id }, '', `/?c=${id}`); });
  }

  function onPopState() {
    const id = Number(new URLSearchParams(location.search).get('c')) || null;
    if (id) loadConversation(id);
    else { state.conversation = null; els.messages.replaceChildren(); markCurrent(); }
  }

  // ---- per-answer actions --------------------------------------------------

  async function copyText(button, text) {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = 'Copied';
    } catch {
      button.textContent = 'Copy failed';
    }
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  }

  function onMessagesClick(event) {
    const codeCopy = event.target.closest('button.copy-code');
    if (codeCopy) {
      const code = codeCopy.closest('.code-block')?.querySelector('code');
      copyText(codeCopy, code ? code.textContent : '');
      return;
    }
    const action = event.target.closest('button.action');
    if (action?.classList.contains('edit-prompt')) { startEditing(action.closest('.message.user')); return; }
    const answer = action?.closest('.message.assistant')?.chatAnswer;
    if (!answer) return;
    if (action.classList.contains('copy-answer')) copyText(action, answer.text);
    if (action.classList.contains('continue-answer')) continueAnswer(answer);
    if (action.classList.contains('regenerate')) {
      const asked = answer.root.previousElementSibling;
      if (asked?.chatPrompt != null) sendPrompt(asked.chatPrompt, answer.messageId);
    }
  }

  // ---- small screens -------------------------------------------------------

  // On a phone the sidebar is a drawer; on wider screens the class changes nothing.
  function setSidebar(open) {
    els.app.classList.toggle('sidebar-open', open);
    els.sidebarToggle.setAttribute('aria-expanded', String(open));
    if (open) requestAnimationFrame(() => els.search.focus()); // once the drawer is visible
    else if (document.activeElement?.closest('#sidebar')) els.sidebarToggle.focus();
  }

  // ---- wiring ------------------------------------------------------------

  function init() {
    els.form.addEventListener('submit', (event) => { event.preventDefault(); sendPrompt(); });
    els.prompt.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        sendPrompt();
      }
    });
    els.prompt.addEventListener('input', () => { autosize(); updateControls(); });
    els.stop.addEventListener('click', stopRunning);
    els.newChat.addEventListener('click', startNewChat);
    els.conversations.addEventListener('click', onConversationClick);
    els.messages.addEventListener('click', onMessagesClick);
    document.addEventListener('keydown', (event) => {
      if (event.key !== 'Escape') return;
      if (els.app.classList.contains('sidebar-open')) { event.preventDefault(); setSidebar(false); return; }
      if (state.running) { event.preventDefault(); stopRunning(); } else if (state.editing) {
        event.preventDefault();
        stopEditing();
        els.prompt.value = '';
        autosize();
        updateControls();
      }
    });
    window.addEventListener('popstate', onPopState);
    let searchTimer = null;
    els.search.addEventListener('input', () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(refreshConversations, 200);
    });
    els.rename.addEventListener('click', startRename);
    els.renameForm.addEventListener('submit', saveRename);
    els.renameCancel.addEventListener('click', endRename);
    els.renameInput.addEventListener('keydown', (event) => {
      if (event.key === 'Escape') { event.preventDefault(); event.stopPropagation(); endRename(); }
    });
    els.remove.addEventListener('click', deleteConversation);
    els.sidebarToggle.addEventListener('click', () => setSidebar(!els.app.classList.contains('sidebar-open')));
    // A tap beside the open drawer closes it.
    document.addEventListener('click', (event) => {
      if (!els.app.classList.contains('sidebar-open')) return;
      if (!event.target.closest('#sidebar, #sidebar-toggle')) setSidebar(false);
    });

    updateControls();
    pollHealth();
    connect();
    if (state.conversation != null) loadConversation(state.conversation, 'prepend');
    markCurrent();
    refreshConversations(); // grouped by day, in the reader's time zone
  }

  init();
})();
