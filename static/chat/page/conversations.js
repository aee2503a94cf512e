// Conversations: the sidebar's list (grouped by day, searchable), switching between them with
// the browser's history, and the current one's tools (rename, delete, export).
import { LIMITS, toId } from './config.js';
import { csrfToken, el, els, showBanner } from './dom.js';
import { renderHistoryMessage, setVersions } from './render.js';
import { adoptRunning, resumeRunning, stopEditing, updateLastActions } from './composer.js';
import { menuButton } from './menubutton.js';
import { confirmDelete } from './confirm.js';
import { setSidebar } from './sidebar.js';
import { state } from './state.js';

function conversationItem(c) {
  const li = el('li', 'chat-item');
  const title = c.title || 'Untitled chat';
  const a = el('a', '', title);
  a.href = `/?c=${c.id}`;
  a.dataset.id = String(c.id);
  if (c.updated_at) a.title = new Date(c.updated_at).toLocaleString();
  li.dataset.id = String(c.id);
  li.dataset.pinned = String(Boolean(c.pinned));
  li.dataset.archived = String(Boolean(c.archived_at));
  li.append(a, menuButton(title));
  return li;
}

export function markCurrent() {
  let current = null;
  for (const a of els.sidebar.querySelectorAll('a[data-id]')) {
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

// Pinned ones first under "Pinned", then newest first, under a heading per day (the reader's
// local day).
function listItems(list) {
  const items = [];
  let last = null;
  for (const c of list) {
    const label = c.pinned ? 'Pinned' : (c.updated_at ? dayLabel(c.updated_at) : '');
    if (label !== last) {
      // A list item of its own: a list may hold only items (role=presentation made it none, which
      // axe-core counts as a serious violation), and a reader hears the day before its chats.
      items.push(el('li', 'day-label', label));
      last = label;
    }
    items.push(conversationItem(c));
  }
  return items;
}

function renderConversationList(list) {
  const items = listItems(list);
  if (!list.length && els.search.value.trim()) items.push(el('li', 'day-label', 'No chats match.'));
  els.conversations.replaceChildren(...items);
  markCurrent();
}

async function fetchList(archived) {
  const q = els.search.value.trim();
  const params = new URLSearchParams();
  if (q) params.set('q', q);
  if (archived) params.set('archived', '1');
  const query = params.toString();
  const res = await fetch(`/api/conversations/${query ? `?${query}` : ''}`, { headers: { Accept: 'application/json' } });
  if (!res.ok) return null;
  const data = await res.json();
  if (!Array.isArray(data.conversations) || els.search.value.trim() !== q) return null;
  return data.conversations;
}

// The archived chats, listed only while their section is open.
async function refreshArchived() {
  if (els.archivedToggle.getAttribute('aria-expanded') !== 'true') return;
  const list = await fetchList(true);
  if (list == null) return;
  const items = list.map(conversationItem);
  if (!items.length) items.push(el('li', 'day-label', 'No archived chats.'));
  els.archived.replaceChildren(...items);
  markCurrent();
}

export function toggleArchived() {
  const open = els.archivedToggle.getAttribute('aria-expanded') !== 'true';
  els.archivedToggle.setAttribute('aria-expanded', String(open));
  els.archived.hidden = !open;
  if (open) refreshArchived();
}

export async function refreshConversations() {
  try {
    const list = await fetchList(false);
    if (list != null) renderConversationList(list);
    await refreshArchived();
  } catch { /* the list is a convenience; keep the old one */ }
}

// ---- the current conversation's tools (rename, delete, download) ----------

function updateTools() {
  const id = state.conversation;
  els.tools.hidden = id == null;
  if (id == null) return;
  els.title.textContent = state.title || 'Untitled chat';
  els.exportMd.href = `/api/conversations/${id}/export?format=markdown`;
  els.exportJson.href = `/api/conversations/${id}/export?format=json`;
}

export function startRename() {
  els.renameInput.value = state.title || '';
  els.renameForm.hidden = false;
  els.title.hidden = true;
  els.renameInput.focus();
  els.renameInput.select();
}

export function endRename() {
  els.renameForm.hidden = true;
  els.title.hidden = false;
  els.rename.focus();
}

export async function conversationRequest(method, body, id = state.conversation) {
  const res = await fetch(`/api/conversations/${id}/`, {
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

export async function saveRename(event) {
  event.preventDefault();
  const title = els.renameInput.value.trim();
  if (!title || state.conversation == null) return;
  const res = await conversationRequest('PATCH', { title });
  if (!res.ok) return;
  state.title = (await res.json()).title;
  endRename();
  refreshConversations();
}

// Deletes chat `id` (the open one by default) once the reader confirms it in the page's dialog.
export async function deleteConversation(id = state.conversation, title = state.title) {
  if (id == null || (id === state.conversation && state.running)) return;
  if (!(await confirmDelete(title || 'this chat'))) return;
  const res = await conversationRequest('DELETE', null, id);
  if (!res.ok) return;
  if (id === state.conversation) startNewChat();
  els.announcer.textContent = 'Chat deleted';
  await refreshConversations();
}

// A new conversation's title, as the server makes it (Conversation.title_from_prompt): cut in
// code points, as Python counts.
function titleFromPrompt(text) {
  const words = text.split(/\s+/).filter(Boolean).join(' ');
  return [...words].slice(0, LIMITS.titleFromPromptChars).join('');
}

// A first prompt creates the conversation server-side; make the page point at it.
export function adoptConversation(id, answer) {
  if (id == null || state.conversation != null || !answer.root.isConnected) return;
  state.conversation = toId(id);
  state.title = titleFromPrompt(answer.prompt);
  history.replaceState({ c: id }, '', `/?c=${id}`);
  if (!els.conversations.querySelector(`a[data-id="${id}"]`)) {
    els.conversations.prepend(conversationItem({ id, title: state.title }));
  }
  markCurrent();
}

// mode "prepend" keeps anything the user sent while history was loading.
export async function loadConversation(id, mode = 'replace') {
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
  showThread(data, id, mode);
  return true;
}

// The conversation's branch as the server sent it (/api/conversations/<id>/).
function showThread(data, id, mode = 'replace') {
  const messages = data.messages || [];
  const nodes = messages.map(renderHistoryMessage);
  state.conversation = toId(data.id ?? id);
  state.title = data.title;
  if (mode === 'prepend') els.messages.prepend(...nodes);
  else els.messages.replaceChildren(...nodes);
  els.messages.scrollTop = els.messages.scrollHeight;
  markCurrent();
  // A streaming answer goes on here: the server sends what it has, then the rest.
  const running = messages.findLast((m) => m.status === 'streaming' && m.role === 'assistant');
  const node = running && nodes[messages.indexOf(running)];
  if (node?.chatAnswer) adoptRunning(node.chatAnswer, running.request_id);
  updateLastActions();
  resumeRunning();
}

// ‹ or › on a message: the server shows that version from now on (this page, a reload, another
// tab, /api and the export), and below it the versions chosen there before.
export async function switchVersion(button) {
  const target = Number(button.dataset.target);
  if (!target || state.running || state.conversation == null) return;
  const res = await fetch(`/api/conversations/${state.conversation}/branch`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-CSRFToken': csrfToken(), Accept: 'application/json' },
    body: JSON.stringify({ message: target }),
  }).catch(() => null);
  if (!res?.ok) {
    const err = res ? await res.json().catch(() => ({})) : {};
    showBanner(err.message || 'Could not switch versions.', err.code || (res ? `http_${res.status}` : 'network'));
    return;
  }
  const data = await res.json();
  const top = els.messages.scrollTop;
  stopEditing();
  showThread(data, state.conversation);
  els.messages.scrollTop = top; // the reader stays where they were
  const shown = els.messages.querySelector(`.message[data-message-id="${target}"]`);
  const same = shown?.querySelector(`.${button.classList.contains('version-prev') ? 'version-prev' : 'version-next'}`);
  (same && !same.disabled ? same : shown?.querySelector('.version:not(:disabled)'))?.focus();
  const versions = shown?.chatVersions || [];
  els.announcer.textContent = `Version ${versions.indexOf(target) + 1} of ${versions.length}.`;
}

// After a new version (Regenerate, Edit): each message on the page learns its versions. The
// page shows the branch the server does; should it not (another tab), it is shown again.
export async function refreshVersions() {
  const id = state.conversation;
  if (id == null) return;
  const res = await fetch(`/api/conversations/${id}/`, { headers: { Accept: 'application/json' } }).catch(() => null);
  if (!res?.ok || state.conversation !== id || state.running) return;
  const data = await res.json();
  const nodes = [...els.messages.querySelectorAll(':scope > .message')];
  const messages = data.messages || [];
  const same = nodes.length === messages.length
    && messages.every((m, i) => nodes[i].classList.contains(m.role));
  if (!same) { showThread(data, id); return; }
  messages.forEach((m, i) => {
    nodes[i].dataset.messageId = m.id;
    setVersions(nodes[i], m.id, m.versions);
  });
}

export function startNewChat() {
  stopEditing();
  setSidebar(false);
  state.conversation = null;
  els.messages.replaceChildren();
  // A new chat starts with the policy the page opened with (the user's choice in settings).
  if (els.policy?.dataset.start) els.policy.value = els.policy.dataset.start;
  history.pushState({ c: null }, '', '/');
  markCurrent();
  els.prompt.focus();
}

export function onConversationClick(event) {
  const a = event.target.closest('a[data-id]');
  // Let modified clicks and clicks during a running answer do a normal navigation.
  if (!a || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  if (state.running) return;
  event.preventDefault();
  setSidebar(false);
  const id = Number(a.dataset.id);
  loadConversation(id).then((ok) => { if (ok) history.pushState({ c: id }, '', `/?c=${id}`); });
}

export function onPopState() {
  const id = Number(new URLSearchParams(location.search).get('c')) || null;
  if (id) loadConversation(id);
  else { state.conversation = null; els.messages.replaceChildren(); markCurrent(); }
}
