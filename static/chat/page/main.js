// The chat page's entry point (templates/chat/index.html): wires the modules to the page's
// elements and starts the socket. Each module says what it owns; docs/development.md maps them.
import { onMessagesClick, onMessagesKeydown, onMessagesSubmit } from './actions.js';
import {
  autosize, cancelEditing, markRunningLost, resumeRunning, sendPrompt, stopRunning, updateControls,
} from './composer.js';
import { closeMenu, wireChatMenu } from './chatmenu.js';
import {
  deleteConversation, endRename, loadConversation, markCurrent, onConversationClick, onPopState,
  refreshConversations, saveRename, startNewChat, startRename, toggleArchived,
} from './conversations.js';
import { els } from './dom.js';
import { handleEvent } from './events.js';
import { pollHealth } from './health.js';
import { setSidebar, sidebarOpen } from './sidebar.js';
import { connect } from './socket.js';
import { state } from './state.js';

function wireComposer() {
  els.form.addEventListener('submit', (event) => { event.preventDefault(); sendPrompt(); });
  els.prompt.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendPrompt();
    }
  });
  els.prompt.addEventListener('input', () => { autosize(); updateControls(); });
  els.stop.addEventListener('click', stopRunning);
  els.messages.addEventListener('click', onMessagesClick);
  els.messages.addEventListener('submit', onMessagesSubmit);
  els.messages.addEventListener('keydown', onMessagesKeydown);
  // Esc closes the drawer, else stops the running answer, else leaves editing.
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Escape' || document.querySelector('dialog[open]')) return; // the dialog's own
    if (sidebarOpen()) { event.preventDefault(); setSidebar(false); return; }
    if (state.running) { event.preventDefault(); stopRunning(); } else if (state.editing) {
      event.preventDefault();
      cancelEditing();
    }
  });
}

function wireConversations() {
  els.newChat.addEventListener('click', startNewChat);
  els.conversations.addEventListener('click', onConversationClick);
  els.archived.addEventListener('click', onConversationClick);
  els.archivedToggle.addEventListener('click', toggleArchived);
  wireChatMenu();
  window.addEventListener('popstate', onPopState);
  let searchTimer = null;
  els.search.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(refreshConversations, 200);
  });
  els.rename.addEventListener('click', startRename);
  els.renameForm.addEventListener('submit', saveRename);
  els.renameCancel.addEventListener('click', endRename);
  els.renameInput.addEventListener('keydown', (event) => {
    if (event.key === 'Escape') { event.preventDefault(); event.stopPropagation(); endRename(); }
  });
  els.remove.addEventListener('click', () => deleteConversation());
  els.sidebarToggle.addEventListener('click', () => setSidebar(!sidebarOpen()));
  // A tap beside the open drawer closes it (not one in the delete dialog it opened).
  document.addEventListener('click', (event) => {
    if (!sidebarOpen()) return;
    if (!event.target.closest('#sidebar, #sidebar-toggle, dialog')) { closeMenu(); setSidebar(false); }
  });
}

wireComposer();
wireConversations();
updateControls();
pollHealth();
connect({
  // A restarted server may still be loading its model: ask before enabling Send again. The
  // answer that was running when the socket went is asked for again.
  onOpen() { pollHealth(); resumeRunning(); },
  onMessage: handleEvent,
  onClose() {
    state.ready = false; // nothing can be sent until the socket is back and the server is ready
    markRunningLost();
    updateControls();
  },
});
if (state.conversation != null) loadConversation(state.conversation, 'prepend');
markCurrent();
refreshConversations(); // grouped by day, in the reader's time zone
