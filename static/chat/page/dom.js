// The page's elements and small helpers to build and show nodes. User text is only ever
// written with textContent.

const $ = (id) => document.getElementById(id);

export const els = {
  prompt: $('prompt'), send: $('send'), stop: $('stop'), form: $('composer'),
  messages: $('messages'), conversations: $('conversations'), newChat: $('new-chat'),
  connection: $('connection'), connectionLabel: $('connection-label'),
  health: $('health-banner'), healthDetail: $('health-detail'),
  banners: $('banners'), counter: $('char-count'), editHint: $('edit-hint'),
  app: document.querySelector('.app'), sidebarToggle: $('sidebar-toggle'), announcer: $('announcer'),
  search: $('search'), tools: $('conversation-tools'), title: $('conversation-title'),
  renameForm: $('rename-form'), renameInput: $('rename-input'), renameCancel: $('rename-cancel'),
  rename: $('rename'), remove: $('delete'), exportMd: $('export-md'), exportJson: $('export-json'),
  sidebar: $('sidebar'), archived: $('archived'), archivedToggle: $('archived-toggle'),
  chatMenu: $('chat-menu'),
  policy: $('policy'), // absent when no policy is stored
};

// The page's CSRF token, for the /api/ calls that change something.
export function csrfToken() {
  return document.querySelector('input[name="csrfmiddlewaretoken"]')?.value || '';
}

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}

// Sets text and hides the node when there is nothing to show.
export function show(node, text) {
  node.textContent = text || '';
  node.hidden = !text;
}

// Keep the list pinned to the bottom only if the reader is already there.
export function keepScrolled(update) {
  const m = els.messages;
  const nearBottom = m.scrollHeight - m.scrollTop - m.clientHeight < 80;
  update();
  if (nearBottom) m.scrollTop = m.scrollHeight;
}

export function showBanner(message, code) {
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
