// An answer's timing line (first character, last, tokens, tokens per second) is a detail most
// readers do not want under every answer: it stays folded behind an "i" button in the answer's
// actions, which shows once there is a line to show (answers.css) and opens or folds it.
import { el } from './dom.js';

let count = 0;

export function timingToggle(metrics) {
  count += 1;
  metrics.id = `timing-${count}`;
  metrics.classList.add('folded');
  // A plain "i", drawn round by answers.css: the ⓘ character is missing from many fonts.
  const button = el('button', 'action timing-toggle', 'i');
  button.type = 'button';
  button.title = 'Timing details';
  button.setAttribute('aria-label', 'Timing details');
  button.setAttribute('aria-expanded', 'false');
  button.setAttribute('aria-controls', metrics.id);
  button.addEventListener('click', () => {
    const open = button.getAttribute('aria-expanded') !== 'true';
    button.setAttribute('aria-expanded', String(open));
    metrics.classList.toggle('folded', !open);
  });
  return button;
}
