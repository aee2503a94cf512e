"""Local decoding: where a token comes from when the model runs in this process.

The transformers model (`backend.LocalBackend`), its requests as rows of one running batch
(`batching`, `decoding`, continuous batching with chunked prefill), the KV cache and the prefix
store it reuses, attention, penalties, stopping, constrained decoding, torch's threads, and the
scheduler in front of it all (`scheduler.ContinuousScheduler`). These modules import torch;
nothing in this file does, so importing the package costs nothing.
"""
