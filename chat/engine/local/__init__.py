"""Local decoding: where a token comes from when the model runs in this process.

`loader.load_backend` builds the transformers model (`backend.LocalBackend`) from what weights/
finds; its requests are rows of one running batch (`batching`, `decoding`: continuous batching
with chunked prefill), with the KV cache and the prefix store it reuses, attention, penalties,
stopping, constrained decoding and torch's threads, and the scheduler in front of it all
(`scheduler.ContinuousScheduler`). Most of these import torch; `scheduler` and `loader` (until
called) do not, and nothing in this file does, so importing the package costs nothing.
"""
