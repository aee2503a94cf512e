// The page's one mutable state, shared by the modules that change it.
import { startConversation } from './config.js';

export const state = {
  ready: false, // the socket is open and /healthz said the model is ready
  conversation: startConversation,
  title: null,
  running: null, // the one live answer, if any
  editing: null, // {answer}: the composer holds the last prompt, to replace that answer
  answers: new Map(), // request_id -> answer
};
