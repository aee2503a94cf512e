// The server's events (docs/protocol.md) applied to the answer they name.
import { constants, EVENT, lookup } from './config.js';
import { keepScrolled, show, showBanner } from './dom.js';
import {
  finishDisplay, formatMetrics, renderStats, setState, setStatus, setText,
  showError, showExplanation, showJson, withdrawnText,
} from './render.js';
import { finish } from './composer.js';
import {
  adoptConversation, loadConversation, refreshConversations, refreshVersions,
} from './conversations.js';
import { state } from './state.js';

function onAccepted(answer, msg) {
  answer.messageId = msg.message;
  if (answer.fromStart) {
    // Resumed from the first event: the events rebuild the text the history showed.
    answer.fromStart = false;
    setText(answer, typeof msg.text_before === 'string' ? msg.text_before : '', { now: true });
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

// A long prompt (a pasted document) is read in chunks before the first word: say how far.
function onReading(answer, msg) {
  if (answer.started) return;
  const read = Number(msg.tokens_read) || 0;
  const total = Number(msg.prompt_tokens) || 0;
  if (!total) return;
  const percent = Math.min(99, Math.floor((100 * read) / total));
  setState(answer, 'reading');
  show(answer.parts.queue, `Reading your message… ${percent}%`);
}

function onChunk(answer, msg) {
  if (answer.retracted) return;
  const piece = typeof msg.text === 'string' ? msg.text : '';
  renderStats.chunks += 1;
  if (piece && answer.tFirst == null) answer.tFirst = performance.now();
  if (!answer.started || answer.parts.status.dataset.kind === 'lost') {
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
  answer.fromStart = false;
  answer.finishReason = msg.finish_reason;
  const info = finishDisplay(msg.finish_reason);
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
    showExplanation(answer, msg.explanation);
    // E.g. cancelled by a stopping server, not by the user: say so.
    const badge = lookup(constants.reasonBadges, msg.reason) ?? info.badge;
    show(answer.parts.badge, [badge, msg.cached ? 'cached' : ''].filter(Boolean).join(' · '));
    answer.parts.badge.title = info.reasonInTitle ? `${info.badge}: ${msg.reason || ''}` : '';
    if (answer.tFirst == null) answer.tFirst = now;
    const m = msg.metrics || {};
    show(answer.parts.metrics, formatMetrics({
      firstMs: answer.tFirst - answer.t0, lastMs: now - answer.t0,
      tokens: m.new_tokens, tps: m.tokens_per_s,
      engine: m.engine, model: m.model, fallback: m.fallback,
    }));
  });
  answer.messageId = msg.message ?? answer.messageId;
  finish(answer, value);
  refreshConversations();
  if (answer.forked) refreshVersions();
}

function onError(msg) {
  const answer = msg.request_id != null ? state.answers.get(msg.request_id) : null;
  if (!answer) {
    // A resume refused (the answer or its conversation is gone): it is not coming back.
    const waiting = state.running;
    if (waiting?.resumePending && msg.code === 'unknown_request') {
      waiting.resumePending = false;
      setStatus(waiting, 'Connection lost', 'lost');
      finish(waiting, 'lost');
    }
    showBanner(msg.message || 'Something went wrong.', msg.code);
    return;
  }
  if (answer.forked && answer.messageId == null && state.conversation != null) {
    // A new version refused (busy, rate limited...): the branch it left is still the one shown.
    showBanner(msg.message || 'Something went wrong.', msg.code);
    finish(answer, 'error');
    loadConversation(state.conversation);
    return;
  }
  keepScrolled(() => showError(answer, msg));
  // An error after the answer ended (e.g. a late cancel) must not rewrite its outcome.
  if (answer.live) {
    setStatus(answer, '');
    // The model failed mid-answer: what it wrote is kept, and Continue may finish it.
    if (msg.code === 'model_error' || msg.code === 'engine_unavailable') answer.finishReason = 'failed';
    finish(answer, 'error');
  }
}

// By the server's names: one it does not list throws here, at start (config.js).
const HANDLERS = {
  [EVENT.accepted]: onAccepted, [EVENT.queued]: onQueued, [EVENT.reading]: onReading, [EVENT.chunk]: onChunk,
  [EVENT.buffering]: onBuffering, [EVENT.retract]: onRetract, [EVENT.cut]: onCut, [EVENT.done]: onDone,
};

// An answer's events are numbered (seq): one the page already applied (a resume overlapping
// what arrived before the socket went) is dropped, so nothing shows twice.
function seen(msg) {
  const answer = msg.request_id != null ? state.answers.get(msg.request_id) : null;
  if (!answer || typeof msg.seq !== 'number') return false;
  // An answer's end is never dropped while it runs here: one rebuilt from what was stored (a
  // killed server sent none) may carry a number the page already had.
  const ending = msg.type === EVENT.done || msg.type === EVENT.error;
  if (msg.seq <= (answer.seq || 0) && !(ending && answer.live)) return true;
  answer.seq = msg.seq;
  return false;
}

export function handleEvent(raw) {
  let msg;
  try { msg = JSON.parse(raw); } catch { return; }
  if (!msg || typeof msg !== 'object' || msg.type === EVENT.pong) return;
  if (seen(msg)) return;
  if (msg.type === EVENT.error) { onError(msg); return; }
  const handler = lookup(HANDLERS, msg.type);
  const answer = state.answers.get(msg.request_id);
  if (answer) answer.resumePending = false;
  if (handler && answer) handler(answer, msg);
}
