"""Test and benchmark helpers that both `tests/` and `bench/` use (docs/development.md).

- liveserver.py: a real daphne on loopback (its own database), for live and browser tests and
  the benchmarks.
- peer.py: `transformers serve --continuous-batching` on loopback, the peer the benchmark measures
  and the real engine of the remote-tier tests.
- openai_server.py: a small OpenAI-compatible streaming server serving the real model's tokens.
- scripted.py: a backend that plays back scripted answers, for unit tests of what happens around
  generation.

Nothing here is imported by the product (`chat/`, `project/`).
"""
