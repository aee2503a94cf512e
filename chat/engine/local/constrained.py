"""Grammar-constrained decoding: only tokens that keep the output valid for a JSON Schema, or
tool calls in the `<tool_call>` format (Qwen's and Hermes's; chat/policy/tool_calls.py writes
and reads it) with arguments valid for their function's parameters.

Uses xgrammar's transformers logits processor. A small model rarely writes clean JSON
unaided (`manage.py jsonpassrate` measures it; docs/engine.md), so a schema always binds.
A schema xgrammar cannot compile is not constrained (logged once): the turn's validation and
re-asks still hold the answer to it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
# xgrammar's objects (its types are skipped: mypy.ini), None when it failed; least recently used
# first. Bounded: /v1 clients send schemas and tools of their own, each compiled once.
_compiled: OrderedDict[str, Any] = OrderedDict()
COMPILED_KEPT = 64
_compilers: dict[int, Any] = {}


def _compiler(tokenizer: Any, vocab_size: int) -> Any:
    import xgrammar as xgr

    compiler = _compilers.get(id(tokenizer))
    if compiler is None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        compiler = _compilers[id(tokenizer)] = xgr.GrammarCompiler(info)
    return compiler


def _processor(key: str, tokenizer: Any, vocab_size: int, compile: Callable[[Any], Any]) -> Any:
    """A fresh per-request processor (it keeps matcher state) for a grammar compiled once per
    key, or None when the grammar cannot be compiled."""
    from xgrammar.contrib.hf import LogitsProcessor

    with _lock:
        if key not in _compiled:
            try:
                _compiled[key] = compile(_compiler(tokenizer, vocab_size))
            except Exception as exc:  # xgrammar raises plain RuntimeErrors for what it lacks
                log.warning("decoding not constrained: xgrammar cannot compile %s: %s", key, exc)
                _compiled[key] = None
            while len(_compiled) > COMPILED_KEPT:
                _compiled.popitem(last=False)
        _compiled.move_to_end(key)
        grammar = _compiled[key]
    return None if grammar is None else LogitsProcessor(grammar)


def logits_processor(tokenizer: Any, vocab_size: int, schema: dict[str, Any]) -> Any:
    """A processor for JSON valid for `schema`, or None if xgrammar cannot express it."""
    key = "schema:" + json.dumps(schema, sort_keys=True)
    return _processor(
        key,
        tokenizer,
        vocab_size,
        lambda compiler: compiler.compile_json_schema(schema, any_whitespace=False),
    )


def tool_call_processor(tokenizer: Any, vocab_size: int, spec: dict[str, Any]) -> Any:
    """A processor for `spec` (GenerationRequest.tool_grammar: OpenAI's `tools`, `tool_choice`
    and `parallel_tool_calls`), or None. xgrammar's Qwen-3 structural tag is that format: under
    "auto" free text until `<tool_call>`, then a call of a listed function; under "required" or
    a named function only calls."""

    def compile(compiler: Any) -> Any:
        import xgrammar as xgr

        tag = xgr.get_model_structural_tag(
            "qwen_3",
            tools=spec["tools"],
            tool_choice=spec["tool_choice"],
            reasoning="disabled",
            parallel_tool_calls=spec["parallel_tool_calls"],
        )
        return compiler.compile_structural_tag(tag)

    key = "tools:" + json.dumps(spec, sort_keys=True)
    return _processor(key, tokenizer, vocab_size, compile)
