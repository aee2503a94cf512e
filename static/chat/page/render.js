// A message on the page: its elements, its answer states (data-state) and its text. An answer
// is rendered as Markdown by markdown.js (raw HTML off, then DOMPurify), at most once per
// animation frame however fast its chunks arrive.
import { constants, lookup } from './config.js';
import { el, keepScrolled, show } from './dom.js';
import { applyStoredFeedback, buildFeedback } from './feedback.js';
import { timingToggle } from './timing.js';

// Chunks received vs Markdown renders done, for the page's tests and the figure in docs/using.md.
export const renderStats = { chunks: 0, renders: 0 };
window.__chatRenderStats = renderStats;

// finish_reason -> data-state and badge text, as the server says (chat/page_constants.py).
export function finishDisplay(reason) {
  return lookup(constants.finish, reason) || lookup(constants.finish, 'eos');
}

function secs(ms) { return (ms / 1000).toFixed(2); }

export function formatMetrics({ firstMs, lastMs, tokens, tps, engine, model, fallback }) {
  const parts = [];
  // An engine row's answer names it (the default engine's answers look as they always did).
  if (engine && engine !== 'default') parts.push(`${engine} (${model})${fallback ? ', as fallback' : ''}`);
  if (typeof firstMs === 'number') parts.push(`first character ${secs(firstMs)} s`);
  if (typeof lastMs === 'number') parts.push(`last ${secs(lastMs)} s`);
  if (typeof tokens === 'number') parts.push(`${tokens} ${tokens === 1 ? 'token' : 'tokens'}`);
  if (typeof tps === 'number') parts.push(`${tps.toFixed(1)} tok/s`);
  return parts.join(' · ');
}

export function withdrawnText(reason) {
  return reason ? `Answer withdrawn: ${reason}` : 'Answer withdrawn';
}

function actionButton(className, label, title) {
  const button = el('button', `action ${className}`, label);
  button.type = 'button';
  button.title = title;
  return button;
}

export function buildUser(text) {
  const root = el('article', 'message user');
  const actions = el('div', 'actions');
  const edit = actionButton('edit-prompt', 'Edit', 'Edit this message and send it again');
  edit.hidden = true;
  actions.append(edit);
  root.append(el('div', 'meta', 'You'), el('div', 'text', text), actions);
  root.chatPrompt = text;
  return root;
}

// "‹ 2/3 ›" on a message with other versions (Regenerate, Edit): the buttons name the version
// they show (data-target); the position is read out when it changes.
export function setVersions(node, id, versions) {
  node.querySelector('.versions')?.remove();
  node.chatVersions = Array.isArray(versions) ? versions : [id];
  const at = node.chatVersions.indexOf(id);
  if (node.chatVersions.length < 2 || at < 0) return;
  const count = node.chatVersions.length;
  const box = el('span', 'versions');
  box.setAttribute('role', 'group');
  box.setAttribute('aria-label', 'Versions');
  const step = (className, label, text, target) => {
    const button = el('button', `version ${className}`, text);
    button.type = 'button';
    button.setAttribute('aria-label', label);
    button.title = label;
    if (target == null) button.disabled = true;
    else button.dataset.target = String(target);
    return button;
  };
  const position = el('span', 'version-position');
  position.setAttribute('aria-live', 'polite');
  position.append(el('span', 'visually-hidden', 'Version '), `${at + 1}/${count}`);
  box.append(
    step('version-prev', 'Previous version', '‹', node.chatVersions[at - 1]),
    position,
    step('version-next', 'Next version', '›', node.chatVersions[at + 1]),
  );
  node.querySelector('.meta').append(box);
}

export function buildAnswer() {
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
    explanation: el('div', 'explanation'),
    metrics: el('div', 'metrics'),
    actions: el('div', 'actions'),
  };
  for (const key of ['badge', 'queue', 'status', 'json', 'valid', 'error', 'explanation', 'metrics']) parts[key].hidden = true;
  const regenerate = actionButton('regenerate', 'Regenerate', 'A new answer to the same prompt');
  regenerate.hidden = true;
  const more = actionButton('continue-answer', 'Continue', 'Write the rest of this answer');
  more.hidden = true;
  const feedback = buildFeedback();
  parts.actions.append(actionButton('copy-answer', 'Copy', 'Copy the answer as Markdown'), more, regenerate,
    feedback.up, feedback.down, timingToggle(parts.metrics));
  meta.append(el('span', 'role', 'Assistant'), parts.badge);
  root.append(meta, parts.queue, parts.status, parts.text, parts.valid, parts.json, parts.error,
    parts.explanation, parts.actions, parts.metrics, feedback.form, feedback.thanks);
  const answer = { root, parts, feedback, rating: null, text: '', plain: false, renderQueued: false };
  root.chatAnswer = answer;
  return answer;
}

export function setState(answer, value) { answer.root.dataset.state = value; }

function renderNow(answer) {
  answer.renderQueued = false;
  renderStats.renders += 1;
  if (answer.plain) answer.parts.text.textContent = answer.text;
  else answer.parts.text.replaceChildren(window.ChatMarkdown.render(answer.text));
}

// The text changes per chunk; the DOM at most once per frame.
export function setText(answer, text, { plain = false, now = false } = {}) {
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
export function showJson(answer, value) {
  answer.parts.text.hidden = true;
  show(answer.parts.json, JSON.stringify(value, null, 2));
  answer.parts.valid.hidden = false;
  answer.text = answer.parts.json.textContent;
}

// Why an invalid or withdrawn answer failed (the `done` event's `explanation`, or the stored
// message's): what the policy expects and, where its policy allows, what the model wrote, which
// Copy then copies. Its Regenerate becomes "Try again".
export function showExplanation(answer, explanation) {
  if (!explanation || typeof explanation !== 'object') return;
  const box = answer.parts.explanation;
  const lines = [el('p', 'explanation-summary', explanation.summary || 'The answer failed this policy.')];
  if (explanation.expected) lines.push(el('p', 'explanation-expected', `Expected: ${explanation.expected}`));
  if (explanation.detail) lines.push(el('p', 'explanation-detail', `Why: ${explanation.detail}`));
  if (typeof explanation.raw_text === 'string') {
    lines.push(el('p', 'explanation-raw-label', 'What the model wrote:'), el('pre', 'explanation-raw', explanation.raw_text));
    answer.copyText = explanation.raw_text;
  }
  box.replaceChildren(...lines);
  if (typeof explanation.policy === 'string') answer.retryPolicy = explanation.policy;
  box.hidden = false;
  const retry = answer.root.querySelector('.regenerate');
  retry.textContent = 'Try again';
  retry.title = 'Ask the same prompt again for a new answer';
}

export function setStatus(answer, text, kind) {
  show(answer.parts.status, text);
  answer.parts.status.dataset.kind = kind || '';
}

export function showError(answer, msg) {
  const box = answer.parts.error;
  box.replaceChildren(el('span', 'error-message', msg.message || 'Something went wrong.'));
  if (msg.code) box.append(el('small', 'code', msg.code));
  box.hidden = false;
}

// A message of /api/conversations/<id>/: a prompt, or an answer as it was stored.
export function renderHistoryMessage(m) {
  if (m.role === 'user') {
    const node = buildUser(m.text || '');
    node.dataset.messageId = m.id;
    setVersions(node, m.id, m.versions);
    return node;
  }
  const answer = buildAnswer();
  // An answer that did not end as `done` shows its status, whatever its finish_reason.
  const { state: value, badge } = lookup(constants.status, m.status) || finishDisplay(m.finish_reason);
  if (value === 'streaming') setStatus(answer, 'Resuming…', 'lost');
  setState(answer, value);
  answer.root.dataset.messageId = m.id;
  answer.messageId = m.id;
  answer.finishReason = m.status === 'done' ? m.finish_reason : m.status;
  setVersions(answer.root, m.id, m.versions);
  applyStoredFeedback(answer, m.feedback);
  if (value === 'retracted') setText(answer, withdrawnText(''), { plain: true, now: true });
  else setText(answer, m.text || '', { now: true });
  if (value === 'retracted') answer.root.classList.add('withdrawn');
  show(answer.parts.badge, badge);
  if (m.json != null && value !== 'retracted') showJson(answer, m.json);
  showExplanation(answer, m.explanation);
  if (m.metrics) {
    const x = m.metrics;
    show(answer.parts.metrics, formatMetrics({
      firstMs: x.ttft_ms, lastMs: x.total_ms, tokens: x.new_tokens, tps: x.tokens_per_s,
      engine: x.engine, model: x.model, fallback: x.fallback,
    }));
  }
  return answer.root;
}
