// The page's one WebSocket: connects, pings, and reconnects with backoff after any close. A
// close with the server's restart code (chat/protocol.py, served) is shown as a restart.
import { constants, FRAME } from './config.js';
import { els } from './dom.js';

const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 8000;
const PING_MS = 25000;

let ws = null;
let backoff = BACKOFF_MIN_MS;
let pingTimer = null;
let handlers = null;

export function isOpen() { return ws?.readyState === WebSocket.OPEN; }

export function send(frame) { ws.send(JSON.stringify(frame)); }

function setConnection(open, restarting = false) {
  els.connection.dataset.state = open ? 'open' : 'closed';
  els.connectionLabel.textContent = open
    ? 'connected'
    : restarting ? 'the server restarted, reconnecting…' : 'reconnecting…';
}

// handlers: onOpen(), onMessage(text), onClose() once the socket is gone (a reconnect follows).
export function connect(given) {
  handlers = given;
  open();
}

function open() {
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
    setConnection(false, event.code === constants.closeCodes.serverRestarting);
    handlers.onClose();
    scheduleReconnect();
  });
}

function scheduleReconnect() {
  setTimeout(open, backoff);
  backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
}
