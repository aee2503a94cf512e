// Thumbs up or down on an answer, with an optional comment (POST /api/messages/<id>/feedback;
// docs/using.md). Pressing the pressed thumb again takes the rating back (DELETE). The comment
// box opens under the answer after a thumb is pressed; sending it stores the rating with it.
import { csrfToken, el, els, showBanner } from './dom.js';

const LABELS = { 1: 'Good answer', '-1': 'Bad answer' };

// Words, like the page's other actions: an emoji needs a font the reader may not have.
function thumb(rating, text) {
  const button = el('button', `action rate ${rating === 1 ? 'rate-up' : 'rate-down'}`, text);
  button.type = 'button';
  button.dataset.rating = String(rating);
  button.setAttribute('aria-label', LABELS[rating]);
  button.setAttribute('aria-pressed', 'false');
  button.title = `${LABELS[rating]} (press again to take it back)`;
  button.hidden = true;
  return button;
}

let formCount = 0;

// The thumbs for a new answer's actions row, and its comment form (hidden until a thumb is pressed).
export function buildFeedback() {
  formCount += 1;
  const form = el('form', 'feedback-form');
  form.hidden = true;
  const id = `feedback-comment-${formCount}`;
  const label = el('label', 'feedback-label', 'What was good or wrong? (optional)');
  label.htmlFor = id;
  const comment = el('textarea', 'feedback-comment');
  comment.id = id;
  comment.rows = 2;
  comment.maxLength = 2000;
  const send = el('button', 'action feedback-send', 'Send feedback');
  send.type = 'submit';
  const close = el('button', 'action feedback-close', 'Close');
  close.type = 'button';
  const buttons = el('div', 'feedback-buttons');
  buttons.append(send, close);
  form.append(label, comment, buttons);
  // What replaces the form once it is sent (the announcer says it too).
  const thanks = el('p', 'feedback-thanks', THANKS);
  thanks.hidden = true;
  return { up: thumb(1, 'Good'), down: thumb(-1, 'Bad'), form, comment, thanks };
}

const THANKS = 'Thanks — your feedback was sent';

function openCommentForm(answer) {
  answer.feedback.thanks.hidden = true;
  answer.feedback.form.hidden = false;
}

function showRating(answer, rating) {
  answer.rating = rating;
  for (const button of [answer.feedback.up, answer.feedback.down]) {
    button.setAttribute('aria-pressed', String(Number(button.dataset.rating) === rating));
  }
}

// A history answer's stored rating ({rating, comment} or null).
export function applyStoredFeedback(answer, stored) {
  showRating(answer, stored?.rating ?? null);
  answer.feedback.comment.value = stored?.comment || '';
}

// Thumbs show on every finished answer the server has stored.
export function updateRatings() {
  for (const node of els.messages.querySelectorAll('.message.assistant')) {
    const answer = node.chatAnswer;
    if (!answer?.feedback) continue;
    const rateable = answer.messageId != null && !answer.live && answer.root.dataset.state !== 'streaming';
    answer.feedback.up.hidden = !rateable;
    answer.feedback.down.hidden = !rateable;
  }
}

async function send(answer, method, body) {
  const res = await fetch(`/api/messages/${answer.messageId}/feedback`, {
    method,
    headers: { 'Content-Type': 'application/json', 'X-CSRFToken': csrfToken(), Accept: 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  });
  if (res.ok) return true;
  let message = 'The feedback could not be saved.';
  let code;
  try { ({ message, code } = await res.json()); } catch { /* a page, not JSON */ }
  showBanner(message, code);
  return false;
}

export async function onThumb(answer, button) {
  const rating = Number(button.dataset.rating);
  if (answer.rating === rating) {
    if (await send(answer, 'DELETE')) {
      showRating(answer, null);
      answer.feedback.form.hidden = true;
      answer.feedback.thanks.hidden = true;
      els.announcer.textContent = 'Rating taken back';
    }
    return;
  }
  const comment = answer.feedback.comment.value.trim();
  if (!(await send(answer, 'POST', { rating, comment }))) return;
  showRating(answer, rating);
  openCommentForm(answer);
  els.announcer.textContent = `Rated: ${LABELS[rating]}. You may add a comment.`;
  answer.feedback.comment.focus();
}

export async function onCommentSubmit(answer, event) {
  event.preventDefault();
  if (answer.rating == null) return;
  const body = { rating: answer.rating, comment: answer.feedback.comment.value.trim() };
  if (!(await send(answer, 'POST', body))) return;
  answer.feedback.form.hidden = true;
  answer.feedback.thanks.hidden = false;
  els.announcer.textContent = THANKS;
  (answer.rating === 1 ? answer.feedback.up : answer.feedback.down).focus();
}

export function closeCommentForm(answer) {
  answer.feedback.form.hidden = true;
  (answer.rating === -1 ? answer.feedback.down : answer.feedback.up).focus();
}
