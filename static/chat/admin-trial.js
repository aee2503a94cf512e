// The policy change page's workbench: "Try this draft" and "Run the regression set" post the
// form's current (unsaved) values; the server answers with an HTML fragment for the output.
document.addEventListener('DOMContentLoaded', () => {
  const panel = document.getElementById('trial-panel');
  if (!panel) return;
  const form = panel.closest('form');

  function wire(button, url, status, output) {
    if (!button) return;
    button.addEventListener('click', async () => {
      button.disabled = true;
      status.textContent = 'running…';
      try {
        const response = await fetch(url, {
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
  }

  wire(
    document.getElementById('trial-run'),
    panel.dataset.url,
    document.getElementById('trial-status'),
    document.getElementById('trial-output'),
  );
  const regressions = document.getElementById('regressions-run');
  wire(
    regressions,
    regressions?.dataset.url,
    document.getElementById('regressions-status'),
    document.getElementById('regressions-output'),
  );
});
