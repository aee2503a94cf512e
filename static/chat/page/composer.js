// The composer and the live answer: the prompt box and its counter, Send, Stop, Continue,
// Regenerate, Edit and resend, and the policy picker. One answer runs at a time.
import { constants, FRAME, LIMITS } from './config.js';
import { els, keepScrolled, showBanner } from './dom.js';
import { updateRatings } from './feedback.js';
import { buildAnswer, buildUser, setState, setStatus } from './render.js';
import { isOpen, send } from './socket.js';
import { state } from './state.js';

// Python counts code points, so count them here too (not UTF-16 units).
function charCount(text) { return [...text].length; }

let requestCounter = 0;

export function updateControls() {
  const len = charCount(els.prompt.value);
  const over = len > LIMITS.maxPromptChars;
  els.counter.textContent = `${len} / ${LIMITS.maxPromptChars}`;
  els.counter.classList.toggle('over', over);
  els.prompt.setAttribute('aria-invalid', String(over));
  els.send.disabled = !state.ready || Boolean(state.running) || over;
  els.stop.hidden = !state.running;
  els.stop.disabled = Boolean(state.running?.stopping);
}

export function autosize() {
  els.prompt.style.height = 'auto';
  els.prompt.style.height = `${Math.min(els.prompt.scrollHeight, 240)}px`;
}

function newRequestId() {
  requestCounter += 1;
  return `r${requestCounter}-${Math.random().toString(36).slice(2, 8)}`;
}

// From the composer, or a Regenerate (`text` given); `replace` names the answer it replaces,
// `policy` the policy to ask under instead of the picker's (Try again: the failed answer's).
export function sendPrompt(text = null, replace = state.editing?.answer.messageId ?? null, policy = null) {
  const fromComposer = text == null;
  if (fromComposer) text = els.prompt.value;
  if (els.send.disabled || !text.trim()) return;
  if (!isOpen()) {
    showBanner('Not connected to the server yet. Reconnecting…', 'offline');
    return;
  }
  const answer = buildAnswer();
  answer.requestId = newRequestId();
  answer.prompt = text;
  answer.live = true;
  answer.root.setAttribute('aria-busy', 'true'); // not read out chunk by chunk
  answer.root.dataset.requestId = answer.requestId;
  setState(answer, 'queued');
  state.answers.set(answer.requestId, answer);
  state.running = answer;
  const { nodes, forked } = forkAt(replace, text);
  answer.forked = forked; // the page learns the messages' versions once it ends (events.js)
  keepScrolled(() => els.messages.append(...nodes, answer.root));
  els.messages.scrollTop = els.messages.scrollHeight;

  answer.t0 = performance.now();
  const frame = { type: FRAME.prompt, request_id: answer.requestId, text, conversation: state.conversation };
  if (policy || els.policy?.value) frame.policy = policy || els.policy.value;
  if (replace != null) frame.replace = replace;
  send(frame);
  if (fromComposer) {
    els.prompt.value = '';
    stopEditing();
  }
  autosize();
  updateLastActions();
  updateControls();
}

// A prompt replacing answer `messageId` forks the thread there, as the server does: with the same
// text, a new version of that answer (Regenerate); with other text, a new version of its prompt
// (Edit). What follows the fork leaves the page (it stays a version, a switch away); the nodes to
// append after it are returned.
function forkAt(messageId, text) {
  const answered = messageId == null ? null : [...els.messages.querySelectorAll('.message.assistant')]
    .find((node) => node.chatAnswer?.messageId === messageId);
  const asked = answered?.previousElementSibling;
  if (!answered || !asked?.classList.contains('user')) return { nodes: [buildUser(text)], forked: false };
  const regenerate = asked.chatPrompt === text;
  const from = regenerate ? answered : asked;
  while (from.nextElementSibling) from.nextElementSibling.remove();
  from.remove();
  return { nodes: regenerate ? [] : [buildUser(text)], forked: true };
}

// The rest of an answer cut off at the token limit, written into the same message.
export function continueAnswer(answer) {
  if (state.running || !isOpen()) return;
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
  answer.seq = 0; // a new request: its events are numbered from 1 again
  send({ type: FRAME.continue, request_id: answer.requestId, message: answer.messageId });
  updateLastActions();
  updateControls();
}

// Regenerate and Continue apply to the last answer once it has ended; Edit to any prompt whose
// answer the server has named. Nothing changes the thread while an answer runs.
export function updateLastActions() {
  updateRatings();
  for (const button of els.messages.querySelectorAll('.regenerate, .edit-prompt, .continue-answer')) button.hidden = true;
  for (const button of els.messages.querySelectorAll('.version[data-target]')) button.disabled = Boolean(state.running);
  if (state.running) return;
  for (const asked of els.messages.querySelectorAll('.message.user')) {
    if (asked.nextElementSibling?.chatAnswer?.messageId != null) asked.querySelector('.edit-prompt').hidden = false;
  }
  const answers = els.messages.querySelectorAll('.message.assistant');
  const last = answers[answers.length - 1];
  if (!last || last.chatAnswer?.messageId == null) return;
  last.querySelector('.regenerate').hidden = false;
  last.querySelector('.continue-answer').hidden = !(constants.continuableReasons || [constants.continuable])
    .includes(last.chatAnswer.finishReason);
}

export function startEditing(userNode) {
  const answerNode = userNode.nextElementSibling;
  if (!answerNode?.chatAnswer) return;
  state.editing = { answer: answerNode.chatAnswer };
  els.prompt.value = userNode.chatPrompt;
  els.editHint.hidden = false;
  autosize();
  updateControls();
  els.prompt.focus();
}

export function stopEditing() {
  state.editing = null;
  els.editHint.hidden = true;
}

// Esc while editing: the composer goes back to empty.
export function cancelEditing() {
  stopEditing();
  els.prompt.value = '';
  autosize();
  updateControls();
}

export function stopRunning() {
  const answer = state.running;
  if (!answer || !isOpen()) return;
  answer.stopping = true;
  // By its message once the server named it: a resumed answer may run in another process.
  const frame = { type: FRAME.cancel, request_id: answer.requestId };
  if (answer.messageId != null) frame.message = answer.messageId;
  send(frame);
  updateControls();
}

const ANNOUNCE = {
  done: 'Answer finished.', cancelled: 'Answer stopped.', retracted: 'Answer withdrawn.',
  invalid: 'Answer invalid.', error: 'The answer failed.', lost: 'Connection lost.',
};

// Ends the live phase of an answer and frees the composer.
export function finish(answer, value) {
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

// The socket went: the server keeps the answer going for a grace period, so the page asks for
// the rest once it is back (resumeRunning). One it never heard accepted cannot be asked for.
export function markRunningLost() {
  const answer = state.running;
  if (!answer) return;
  if (answer.messageId == null) {
    setStatus(answer, 'Connection lost', 'lost');
    finish(answer, 'lost');
    return;
  }
  answer.needsResume = true;
  setStatus(answer, 'Reconnecting…', 'lost');
}

// An answer that was streaming when the page loaded (a reload, a tab woken up): it is the
// running one, and the server is asked for its events from the first.
export function adoptRunning(answer, requestId) {
  if (state.running || !requestId) return false;
  answer.requestId = requestId;
  answer.root.dataset.requestId = requestId;
  answer.live = true;
  answer.seq = 0;
  answer.fromStart = true; // its accepted resets the text the history showed
  answer.needsResume = true;
  answer.t0 = performance.now();
  answer.root.setAttribute('aria-busy', 'true');
  state.answers.set(requestId, answer);
  state.running = answer;
  setStatus(answer, 'Resuming…', 'lost');
  updateControls();
  return true;
}

// Ask the server for what the running answer missed, from the last event the page applied.
export function resumeRunning() {
  const answer = state.running;
  if (!answer?.needsResume || answer.messageId == null || !isOpen()) return;
  answer.needsResume = false;
  answer.resumePending = true; // until the server answers for it (events.js)
  send({ type: FRAME.resume, message: answer.messageId, after: answer.seq || 0 });
}
