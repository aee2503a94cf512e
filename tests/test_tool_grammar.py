"""The tool-call grammar and the format chat/policy/tool_calls.py writes and reads agree, and a
constrained tool-call row decodes beside a prose row in one batch (the real model)."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from chat.engine.local import constrained
from chat.policy import ToolSpec
from chat.policy.tool_calls import call_text, judge_calls, tools_instruction

pytestmark = pytest.mark.integration

WEATHER = (
    "get_weather",
    "The current weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
ADD = (
    "add",
    "",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
CALL = call_text("get_weather", {"city": "Paris"})


def _accepts(backend, spec: ToolSpec, text: str) -> bool:
    """Whether the compiled grammar takes `text` and may then end."""
    import xgrammar as xgr

    processor = constrained.tool_call_processor(
        backend.tokenizer, backend.model.config.vocab_size, spec.grammar()
    )
    matcher = xgr.GrammarMatcher(processor.compiled_grammars[0])
    return matcher.accept_string(text) and matcher.accept_token(backend.tokenizer.eos_token_id)


@pytest.mark.parametrize(
    ("choice", "parallel", "text", "accepted"),
    [
        ("auto", True, "It is sunny.", True),
        ("auto", True, CALL, True),
        ("auto", True, CALL + "\n" + call_text("add", {"a": 1, "b": 2}), True),
        ("auto", False, CALL + "\n" + CALL, False),
        ("required", True, "It is sunny.", False),
        ("required", True, CALL, True),
        ("add", True, CALL, False),
        ("get_weather", True, CALL, True),
        ("auto", True, call_text("get_weather", {"city": 3}), False),
        ("auto", True, call_text("nope", {}), False),
    ],
)
def test_the_grammar_takes_exactly_the_calls_the_judge_takes(
    backend, choice, parallel, text, accepted
):
    spec = ToolSpec(functions=(WEATHER, ADD), choice=choice, parallel=parallel)
    assert _accepts(backend, spec, text) is accepted
    if accepted:
        assert judge_calls(text, spec).error == ""


def test_a_forced_call_decodes_beside_prose_and_is_valid(backend):
    spec = ToolSpec(functions=(WEATHER, ADD), choice="required")
    asked = [
        {"role": "system", "content": tools_instruction(spec)},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    story = [{"role": "user", "content": "Tell me a story."}]
    prose, called = backend.generate_batch(
        [
            backend.request(story, max_new_tokens=16, min_new_tokens=16),
            backend.request(asked, max_new_tokens=60, tool_grammar=spec.grammar()),
        ],
        [lambda _: None, lambda _: None],
    )
    judged = judge_calls(called.text, spec)
    assert judged.calls and not judged.error
    assert prose.new_tokens == 16


def test_a_schema_xgrammar_cannot_compile_is_left_unconstrained(backend, monkeypatch, caplog):
    """Validation and re-asks still hold the answer to it; the turn does not fail."""

    def refuse(*_args, **_kwargs):
        raise RuntimeError("unsupported keyword")

    monkeypatch.setattr(constrained, "_compiled", OrderedDict())
    compiler = constrained._compiler(backend.tokenizer, backend.model.config.vocab_size)
    monkeypatch.setattr(type(compiler), "compile_json_schema", refuse)
    schema = {"type": "object", "title": "refused"}
    assert constrained.logits_processor(backend.tokenizer, 49152, schema) is None
    assert "cannot compile" in caplog.text


def test_compiled_grammars_are_kept_up_to_a_bound_least_recently_used_first(backend, monkeypatch):
    """/v1 clients bring schemas of their own: each is compiled once, and the oldest leave."""
    monkeypatch.setattr(constrained, "_compiled", OrderedDict())
    monkeypatch.setattr(constrained, "COMPILED_KEPT", 2)
    vocab = backend.model.config.vocab_size

    def schema(name: str) -> dict:
        return {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}

    for name in ("first", "second"):
        assert constrained.logits_processor(backend.tokenizer, vocab, schema(name)) is not None
    constrained.logits_processor(backend.tokenizer, vocab, schema("first"))  # used again
    assert constrained.logits_processor(backend.tokenizer, vocab, schema("third")) is not None
    kept = "".join(constrained._compiled)
    assert len(constrained._compiled) == 2 and "first" in kept and "second" not in kept
