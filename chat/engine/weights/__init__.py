"""The model's weights: found, converted once, fingerprinted, and computed in the chosen form.

The bundled GGUF converted to safetensors (`loading`; `python -m chat.engine.weights.convert`),
weight-only quantized linears and the mode chosen at start-up (`quantized`: torch's int8/int4,
the GGUF file's blocks read; `blockquant` with `kernels/`: those blocks computed), weight-major
matmuls (`weight_major`), and start-up choices remembered per machine (`start_choices`).
"""
