// The policy change page's "Try this draft" panel: posts the form's current (unsaved) values and
// the prompt; the server answers with the result as an HTML fragment, which replaces the output.
document.addEventListener('DOMContentLoaded', () => {
  const panel = document.getElementById('trial-panel');
  if (!panel) return;
  const button = document.getElementById('trial-run');
  const status = document.getElementById('trial-status');
  const output = document.getElementById('trial-output');
  button.addEventListener('click', async () => {
    const form = panel.closest('form');
    button.disabled = true;
    status.textContent = 'running…';
    try {
      const response = await fetch(panel.dataset.url, {
        method: 'POST',
        body: new FormData(form),
        credentials: 'same-origin',
      });
      const html = await response.text();
      // The fragment is the server's own escaped template; parsed, never run as script.
      const parsed = new DOMParser().parseFromString(html, 'text/html');
      output.replaceChildren(...parsed.body.childNodes);
      status.textContent = response.ok ? 'done' : `refused (${response.status})`;
    } catch (error) {
      status.textContent = `could not reach the server: ${error.message}`;
    } finally {
      button.disabled = false;
    }
  });
});
