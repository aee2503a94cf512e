// The "⋯" button beside each chat in the sidebar, which opens the chat menu (chatmenu.js).
import { el } from './dom.js';

export function menuButton(title) {
  const button = el('button', 'chat-menu-button', '⋯');
  button.type = 'button';
  button.setAttribute('aria-haspopup', 'menu');
  button.setAttribute('aria-expanded', 'false');
  button.setAttribute('aria-controls', 'chat-menu');
  button.setAttribute('aria-label', `Options for “${title}”`);
  button.title = 'Rename, pin, archive or delete';
  return button;
}
