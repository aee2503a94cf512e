// The buttons on messages: Copy (an answer, a code block), Continue, Regenerate, Edit, the
// versions' ‹ › and the thumbs with their comment form (feedback.js).
import { continueAnswer, sendPrompt, startEditing } from './composer.js';
import { switchVersion } from './conversations.js';
import { closeCommentForm, onCommentSubmit, onThumb } from './feedback.js';

async function copyText(button, text) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    button.textContent = 'Copy failed';
  }
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
}

export function onMessagesClick(event) {
  const codeCopy = event.target.closest('button.copy-code');
  if (codeCopy) {
    const code = codeCopy.closest('.code-block')?.querySelector('code');
    copyText(codeCopy, code ? code.textContent : '');
    return;
  }
  const version = event.target.closest('button.version');
  if (version) { switchVersion(version); return; }
  const action = event.target.closest('button.action');
  if (action?.classList.contains('edit-prompt')) { startEditing(action.closest('.message.user')); return; }
  const answer = action?.closest('.message.assistant')?.chatAnswer;
  if (!answer) return;
  if (action.classList.contains('rate')) onThumb(answer, action);
  if (action.classList.contains('feedback-close')) closeCommentForm(answer);
  // A failed answer whose raw text is shown: that text, not the empty or withdrawn answer.
  if (action.classList.contains('copy-answer')) copyText(action, answer.copyText ?? answer.text);
  if (action.classList.contains('continue-answer')) continueAnswer(answer);
  if (action.classList.contains('regenerate')) {
    const asked = answer.root.previousElementSibling;
    if (asked?.chatPrompt != null) sendPrompt(asked.chatPrompt, answer.messageId, answer.retryPolicy);
  }
}

export function onMessagesSubmit(event) {
  const answer = event.target.closest('.feedback-form')?.closest('.message.assistant')?.chatAnswer;
  if (answer) onCommentSubmit(answer, event);
}

// Esc in a comment box closes it, and does not stop or cancel anything else.
export function onMessagesKeydown(event) {
  if (event.key !== 'Escape') return;
  const answer = event.target.closest('.feedback-form')?.closest('.message.assistant')?.chatAnswer;
  if (!answer) return;
  event.preventDefault();
  event.stopPropagation();
  closeCommentForm(answer);
}
