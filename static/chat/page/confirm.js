// The page's own confirmation before a chat is deleted: a modal <dialog> (templates/chat/
// index.html), never window.confirm, which blocks the page and cannot be styled or tested.
const dialog = document.getElementById('confirm-delete');
const text = document.getElementById('confirm-delete-text');

// Resolves true when the reader chose Delete; Cancel, Esc or a click beside it resolve false.
export function confirmDelete(title) {
  text.textContent = `“${title}” and all its messages will be deleted. This cannot be undone.`;
  dialog.returnValue = '';
  const opener = document.activeElement;
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => {
      if (opener?.isConnected) opener.focus();
      resolve(dialog.returnValue === 'delete');
    }, { once: true });
  });
}

// A click on the backdrop (the dialog element itself, outside its form) cancels.
dialog.addEventListener('click', (event) => { if (event.target === dialog) dialog.close(); });
