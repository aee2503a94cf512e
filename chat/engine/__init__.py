"""Text generation with no Django in sight: load a model, stream, stop, queue.

Where a token comes from: `local/` (the model in this process, continuous batching) or `remote/`
(an OpenAI-compatible server). `weights/` is what the local model computes with, `sharing/` lets
identical answers in flight share one generation, `text/` is the chat as the model's text.
`types.py` is the contract they implement, `stack.py` the one scheduler stack a process runs.

Usable from plain Python::

    from chat.engine.local.loader import load_backend
    backend = load_backend()
    req = backend.request([{"role": "user", "content": "Hi"}], max_new_tokens=20)
    result = backend.generate(req, on_text=print)
"""

import os

# Spin-waiting OpenMP threads steal the core the event loop and the streamer
# need; PASSIVE cuts streaming overhead from ~30 % to ~3 % on 2 cores. It only
# takes effect if set before torch loads its OpenMP runtime, hence here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
