// /healthz: Send stays off until the server says its model is ready (it may still be loading
// after a start or a restart); the banner says what it is waiting for.
import { els } from './dom.js';
import { state } from './state.js';
import { updateControls } from './composer.js';

let healthTimer = null;

export async function pollHealth() {
  clearTimeout(healthTimer); // one poll loop at a time, however often a socket reopens
  healthTimer = null;
  let detail;
  try {
    const res = await fetch('/healthz', { cache: 'no-store', headers: { Accept: 'application/json' } });
    if (res.ok) {
      state.ready = true;
      els.health.hidden = true;
      updateControls();
      return;
    }
    const body = await res.json().catch(() => ({}));
    detail = body.detail || body.status || `HTTP ${res.status}`;
  } catch {
    detail = 'server unreachable';
  }
  state.ready = false;
  els.healthDetail.textContent = detail;
  els.health.hidden = false;
  updateControls();
  healthTimer = setTimeout(pollHealth, 1000);
}
