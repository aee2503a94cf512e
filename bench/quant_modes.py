"""Load the engine once per weight mode for the quality commands (perplexity, dtypecheck,
jsonpassrate): `none` is today's float model; int8/int4 are CHAT_ENGINE quant's modes, with the
real kernels or, with `simulate`, the very same weights in float nn.Linears (quant_choice.simulate),
for a CPU whose kernels for a mode are too slow to measure quality with in minutes."""

from __future__ import annotations

from dataclasses import replace

MODES = ("none", "int8", "int4", "gguf", "gguf-q8")


def load_mode(mode: str, *, simulate: bool, progress, dtype: str | None = None):
    """A LocalBackend with weights in `mode`; returns (backend, a label for the report)."""
    from chat.engine.local.loader import load_backend
    from chat.engine.weights import quant_choice, weight_major
    from chat.engine.weights.loading import ModelNotFound, bundled_gguf_path
    from chat.infra.runtime import runtime

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    config = replace(runtime.engine_config(), quant="none")
    if dtype:
        config = replace(config, dtype=dtype)
    backend = load_backend(config, progress=progress)
    if mode == "none":
        return backend, f"{backend.model.dtype}".removeprefix("torch.")
    weight_major.unwrap_all(backend.model)
    gguf = None
    if not config.model_path:
        try:
            gguf = bundled_gguf_path()
        except ModelNotFound:
            gguf = None
    if simulate:
        quant_choice.simulate(backend.model, mode, gguf_path=gguf)
        return backend, f"{mode} (simulated)"
    progress(quant_choice.choose(backend.model, mode, lambda: 0.0, gguf_path=gguf))
    return backend, mode
