// The sidebar's per-chat menu: Rename (in place), Pin or Unpin, Archive or Unarchive, Delete
// (after the page's dialog), for any chat, not only the open one. One menu element (#chat-menu)
// serves every chat's "⋯" button. Keyboard as a WAI-ARIA menu button: Enter, Space or Down open
// it on its first item (Up on its last), the arrows, Home and End move, Esc closes it back onto
// its button and Tab closes it.
import { conversationRequest, deleteConversation, markCurrent, refreshConversations } from './conversations.js';
import { el, els } from './dom.js';
import { state } from './state.js';

const menu = els.chatMenu;
const items = () => [...menu.querySelectorAll('[role="menuitem"]')];
let opener = null; // the "⋯" button the menu is open for

function chatOf(button) {
  const item = button.closest('li.chat-item');
  const link = item.querySelector('a[data-id]');
  return {
    item, link, id: Number(item.dataset.id), title: link.textContent,
    pinned: item.dataset.pinned === 'true', archived: item.dataset.archived === 'true',
  };
}

// Under its button, right-aligned with it, or above it where the sidebar ends.
function place(button) {
  const side = els.sidebar.getBoundingClientRect();
  const at = button.getBoundingClientRect();
  const height = menu.offsetHeight;
  let top = at.bottom - side.top + 2;
  if (at.bottom + height > side.bottom) top = at.top - side.top - height - 2;
  menu.style.top = `${Math.max(0, top)}px`;
  menu.style.left = `${Math.max(4, at.right - side.left - menu.offsetWidth)}px`;
}

function openMenu(button, { last = false } = {}) {
  closeMenu();
  const chat = chatOf(button);
  menu.querySelector('[data-action="pin"]').textContent = chat.pinned ? 'Unpin' : 'Pin';
  menu.querySelector('[data-action="archive"]').textContent = chat.archived ? 'Unarchive' : 'Archive';
  menu.setAttribute('aria-label', `Options for “${chat.title}”`);
  opener = button;
  button.setAttribute('aria-expanded', 'true');
  menu.hidden = false;
  place(button);
  const list = items();
  (last ? list[list.length - 1] : list[0]).focus();
}

export function closeMenu({ refocus = false } = {}) {
  if (!opener) return;
  menu.hidden = true;
  opener.setAttribute('aria-expanded', 'false');
  if (refocus && opener.isConnected) opener.focus();
  opener = null;
}

function announce(text) { els.announcer.textContent = text; }

// After the list is drawn again: the moved chat's button keeps the focus, or the search box.
function focusChat(id) {
  const button = els.sidebar.querySelector(`li.chat-item[data-id="${id}"] .chat-menu-button`);
  (button || els.search).focus();
}

async function change(chat, body, said) {
  const res = await conversationRequest('PATCH', body, chat.id);
  if (!res.ok) return;
  announce(said);
  await refreshConversations();
  focusChat(chat.id);
}

function renameInPlace(chat) {
  const button = chat.item.querySelector('.chat-menu-button');
  const form = el('form', 'chat-rename');
  const input = el('input');
  input.id = 'chat-rename-input';
  input.value = chat.title;
  input.maxLength = els.renameInput.maxLength;
  const label = el('label', 'visually-hidden', 'New title (Enter saves, Esc cancels)');
  label.htmlFor = input.id;
  form.append(label, input);
  chat.link.hidden = true;
  button.hidden = true;
  chat.link.after(form);
  input.focus();
  input.select();
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (save && title && title !== chat.title) {
      const res = await conversationRequest('PATCH', { title }, chat.id);
      if (res.ok) {
        chat.link.textContent = (await res.json()).title;
        if (chat.id === state.conversation) markCurrent();
        announce('Chat renamed');
      }
    }
    form.remove();
    chat.link.hidden = false;
    button.hidden = false;
    button.focus();
    refreshConversations().then(() => focusChat(chat.id));
  };
  form.addEventListener('submit', (event) => { event.preventDefault(); finish(true); });
  input.addEventListener('keydown', (event) => {
    if (event.key !== 'Escape') return;
    event.preventDefault();
    event.stopPropagation(); // the drawer stays open
    finish(false);
  });
  input.addEventListener('blur', () => finish(true));
}

function run(action, chat) {
  if (action === 'rename') renameInPlace(chat);
  if (action === 'pin') change(chat, { pinned: !chat.pinned }, chat.pinned ? 'Chat unpinned' : 'Chat pinned');
  if (action === 'archive') {
    change(chat, { archived: !chat.archived }, chat.archived ? 'Chat unarchived' : 'Chat archived');
  }
  if (action === 'delete') {
    // Its button went with it: the keyboard goes on from the search box, not the page's top.
    deleteConversation(chat.id, chat.title).then(() => {
      if (!document.activeElement || document.activeElement === document.body) els.search.focus();
    });
  }
}

function onSidebarClick(event) {
  const button = event.target.closest('.chat-menu-button');
  if (button) {
    if (opener === button) closeMenu({ refocus: true });
    else openMenu(button);
    return;
  }
  const item = event.target.closest('#chat-menu [role="menuitem"]');
  if (item && opener) {
    const chat = chatOf(opener);
    closeMenu({ refocus: true });
    run(item.dataset.action, chat);
  }
}

function onButtonKeydown(event) {
  const button = event.target.closest('.chat-menu-button');
  if (!button || !['ArrowDown', 'ArrowUp'].includes(event.key)) return;
  event.preventDefault();
  openMenu(button, { last: event.key === 'ArrowUp' });
}

function onMenuKeydown(event) {
  const list = items();
  const at = list.indexOf(document.activeElement);
  const moves = {
    ArrowDown: (at + 1) % list.length,
    ArrowUp: (at - 1 + list.length) % list.length,
    Home: 0,
    End: list.length - 1,
  };
  if (event.key in moves) {
    event.preventDefault();
    list[moves[event.key]].focus();
  } else if (event.key === 'Escape') {
    event.preventDefault();
    event.stopPropagation(); // closes the menu, not the drawer
    closeMenu({ refocus: true });
  } else if (event.key === 'Tab') closeMenu();
}

export function wireChatMenu() {
  els.sidebar.addEventListener('click', onSidebarClick);
  els.sidebar.addEventListener('keydown', onButtonKeydown);
  menu.addEventListener('keydown', onMenuKeydown);
  els.sidebar.querySelector('.conversation-nav').addEventListener('scroll', () => closeMenu());
  document.addEventListener('click', (event) => {
    if (opener && !event.target.closest('#chat-menu, .chat-menu-button')) closeMenu();
  });
}
