"""The model's weights: found, converted once, fingerprinted, and computed in the chosen form.

The bundled GGUF found and converted to safetensors (`loading`; `python -m
chat.engine.weights.convert`); weight-only quantized linears: torch's int8/int4 (`quantized`),
the GGUF file's own blocks read (`gguf_blocks`) and computed by C++ kernels (`blockquant`,
`kernels/`); the mode a start runs, CHAT_ENGINE's quant= or `auto`'s timing (`quant_choice`);
weight-major matmuls (`weight_major`); start-up choices remembered per machine
(`start_choices`). local/ uses these when it loads the model; nothing here imports local/.
"""
