// The API keys page: a Copy button for the key shown once. Without this script the key is
// still there to select and copy by hand.
'use strict';

(function () {
  const key = document.getElementById('new-key');
  const button = document.getElementById('copy-key');
  const status = document.getElementById('copy-status');
  if (!key || !button || !status) return;
  button.hidden = false;
  button.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(key.textContent.trim());
      status.textContent = 'Copied.';
    } catch {
      // No clipboard (an insecure origin, or permission refused): select it for the user.
      getSelection().selectAllChildren(key);
      status.textContent = 'Could not copy: the key is selected, press Ctrl+C (⌘C).';
    }
  });
})();
