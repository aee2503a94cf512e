"""Schema-constrained decoding: only tokens that keep the output valid JSON for the schema.

Uses xgrammar's transformers logits processor. A small model rarely writes clean JSON
unaided (`manage.py jsonpassrate` measures it; docs/engine.md), so a policy may ask for this.
"""

from __future__ import annotations

import json
import threading
from typing import Any

_lock = threading.Lock()
_compiled: dict[str, Any] = {}  # xgrammar's objects (its types are skipped: mypy.ini)
_compilers: dict[int, Any] = {}


def logits_processor(tokenizer: Any, vocab_size: int, schema: dict[str, Any]) -> Any:
    """A fresh per-request processor (it keeps matcher state) for a grammar compiled once per schema."""
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor

    key = json.dumps(schema, sort_keys=True)
    with _lock:
        compiler = _compilers.get(id(tokenizer))
        if compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
            compiler = _compilers[id(tokenizer)] = xgr.GrammarCompiler(info)
        if key not in _compiled:
            _compiled[key] = compiler.compile_json_schema(schema, any_whitespace=False)
        grammar = _compiled[key]
    return LogitsProcessor(grammar)
