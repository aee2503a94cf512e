// What the server tells the page, read once at start from two JSON script tags in the page
// (templates/chat/index.html). The browser never executes them, so the strict CSP allows them.
// `constants` comes from chat/page_constants.py: nothing here copies a Python value by hand.

function readJson(id) {
  try {
    return JSON.parse(document.getElementById(id)?.textContent || 'null') || {};
  } catch {
    return {};
  }
}

export const constants = readJson('chat-constants');

export function toId(value) { return value == null || value === '' ? null : Number(value); }

const pageConfig = readJson('chat-config');
const urlId = Number(new URLSearchParams(location.search).get('c')) || null;

// The conversation the page opened on (the server checked it is the reader's).
export const startConversation = toId('conversation' in pageConfig ? pageConfig.conversation : urlId);

// A value from a served map by a key the server sent, never from Object.prototype.
export function lookup(map, key) {
  return map != null && Object.hasOwn(map, key) ? map[key] : undefined;
}

// The wire's names (docs/protocol.md) by name: EVENT.chunk is 'chunk' only if the server lists
// it. A name it does not list throws where it is used, so a page and a server that disagree
// fail loudly at start instead of dropping events.
function names(list, what) {
  const known = Object.fromEntries((list || []).map((name) => [name, name]));
  return new Proxy(known, {
    get(target, key) {
      if (typeof key === 'string' && !Object.hasOwn(target, key)) throw new Error(`the server has no ${what} "${key}"`);
      return target[key];
    },
  });
}

export const EVENT = names(constants.eventTypes, 'event type');
export const FRAME = names(constants.frameTypes, 'frame type');
export const LIMITS = constants.limits || {};
