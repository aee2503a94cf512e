// The page's one WebSocket: connects, pings, and reconnects with backoff after any close. A
// close with the server's restart code (chat/protocol.py, served) is shown as a restart; after the
// one that ends a sign-in (signed out, deactivated, a new password) the page reloads. Offline
// (the browser says so) the socket is closed and the page waits for the network; back online,
// or a hidden tab shown again (a phone waking it), it reconnects at once.
import { constants, FRAME } from './config.js';
import { els } from './dom.js';

const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 8000;
const PING_MS = 25000;

let ws = null;
let backoff = BACKOFF_MIN_MS;
let pingTimer = null;
let handlers = null;
// Set once the page starts to leave (Sign out's form posts and is redirected to the provider's
// sign-out): a reload then would cancel that navigation, and with it the provider's sign-out.
let leaving = false;
const RELOAD_WHILE_LEAVING_MS = 10000; // a navigation that never came (a download link)

export function isOpen() { return ws?.readyState === WebSocket.OPEN; }

export function send(frame) { ws.send(JSON.stringify(frame)); }

let reconnectTimer = null;

function offline() { return navigator.onLine === false; }

function setConnection(open, restarting = false) {
  if (!open && offline()) {
    els.connection.dataset.state = 'offline';
    els.connectionLabel.textContent = 'offline: waiting for the network…';
    return;
  }
  els.connection.dataset.state = open ? 'open' : 'closed';
  els.connectionLabel.textContent = open
    ? 'connected'
    : restarting ? 'the server restarted, reconnecting…' : 'reconnecting…';
}

// handlers: onOpen(), onMessage(text), onClose() once the socket is gone (a reconnect follows).
export function connect(given) {
  handlers = given;
  window.addEventListener('beforeunload', () => { leaving = true; });
  window.addEventListener('offline', () => {
    setConnection(false);
    ws?.close(); // nothing gets through it now; the close handler waits for the network
  });
  window.addEventListener('online', reconnectNow);
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') reconnectNow();
  });
  open();
}

// Back online or shown again: reconnect now rather than after the backoff, if the socket is gone.
function reconnectNow() {
  if (ws && ws.readyState !== WebSocket.CLOSED && ws.readyState !== WebSocket.CLOSING) return;
  backoff = BACKOFF_MIN_MS;
  clearTimeout(reconnectTimer);
  open();
}

function open() {
  reconnectTimer = null;
  if (offline()) { setConnection(false); return; } // the 'online' event reconnects
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  let socket;
  try {
    socket = new WebSocket(`${scheme}://${location.host}${constants.wsPath}`);
  } catch {
    scheduleReconnect();
    return;
  }
  ws = socket;
  socket.addEventListener('open', () => {
    backoff = BACKOFF_MIN_MS;
    setConnection(true);
    handlers.onOpen();
    clearInterval(pingTimer);
    pingTimer = setInterval(() => {
      if (isOpen()) send({ type: FRAME.ping });
    }, PING_MS);
  });
  socket.addEventListener('message', (event) => handlers.onMessage(event.data));
  socket.addEventListener('close', (event) => {
    if (ws !== socket) return;
    clearInterval(pingTimer);
    if (event.code === constants.closeCodes.unauthorised) {
      // The page as whoever the browser is now: a visitor, or signed in anew.
      if (leaving) setTimeout(() => location.reload(), RELOAD_WHILE_LEAVING_MS);
      else location.reload();
      return;
    }
    setConnection(false, event.code === constants.closeCodes.serverRestarting);
    handlers.onClose();
    scheduleReconnect();
  });
}

function scheduleReconnect() {
  clearTimeout(reconnectTimer);
  reconnectTimer = setTimeout(open, backoff);
  backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
}
