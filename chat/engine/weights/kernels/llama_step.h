// One decode step of a Llama-architecture model in one call (llama_step.cpp).
#pragma once

#include <torch/extension.h>

void bind_llama_step(pybind11::module& module);
