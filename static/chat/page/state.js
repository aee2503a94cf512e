// The page's one mutable state, shared by the modules that change it.
import { startConversation } from './config.js';

export const state = {
  ready: false, // the socket is open and /healthz said the model is ready
  conversation: startConversation,
  title: null,
  running: null, // the one live answer, if any
  editing: null, // {answer}: the composer holds a prompt, to send as a new version of it
  answers: new Map(), // request_id -> answer
};
