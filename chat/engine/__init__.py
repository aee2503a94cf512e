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

It reads no environment: project/settings.py reads the configuration, and sets what the native
parts take from the process (OpenMP's wait policy, the venv's ninja on PATH) before torch loads.
"""
