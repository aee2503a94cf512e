"""The OpenAI wire shapes without a server: request parsing, the answer mapping, overrides."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from chat.engine.sampling_params import SamplingChanges, SamplingParams
from chat.stores.policy_store import PolicyOverride, ResolvedPolicy
from chat.transports.openai import (
    ChatRequest,
    OpenAIError,
    answer_of,
    parse_chat_request,
)
from chat.turns.identity import policy_digest
from chat.turns.prepare import overridden, settings_of, settings_text
from harness.examples import fuzz_examples
from tests.test_openai_views import raw_bodies

pytestmark = pytest.mark.unit


def parse(body: dict) -> ChatRequest:
    return parse_chat_request(json.dumps(body).encode(), model_name="smollm2", max_prompt_chars=100)


@settings(max_examples=fuzz_examples(3000), deadline=None, database=None)
@given(raw=raw_bodies)
def test_any_body_parses_or_is_an_openai_error_with_a_4xx(raw):
    try:
        request = parse_chat_request(raw.encode(), model_name="smollm2", max_prompt_chars=100)
    except OpenAIError as exc:
        assert 400 <= exc.status < 500 and exc.message
        assert set(exc.body()["error"]) == {"message", "type", "param", "code"}
    else:
        assert request.text.strip() and request.model


def test_the_model_name_chooses_the_policy_and_the_policy_field_wins():
    assert (
        parse({"model": "smollm2", "messages": [{"role": "user", "content": "x"}]}).policy is None
    )
    body = {"model": "smollm2:json", "messages": [{"role": "user", "content": "x"}]}
    assert parse(body).policy == "json"
    assert parse(body | {"policy": "chat"}).policy == "chat"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.1, 2.5, True, "1"])
def test_temperature_must_be_a_finite_number_in_range(bad):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "temperature": bad}
    with pytest.raises(OpenAIError) as raised:
        parse_chat_request(json.dumps(body).encode(), model_name="smollm2", max_prompt_chars=100)
    assert raised.value.param == "temperature"


def done(**fields) -> dict:
    base = {"text": "", "json": None, "finish_reason": "eos", "reason": None, "cached": False}
    return base | fields


@pytest.mark.parametrize(
    ("event", "shown", "content", "delta", "finish"),
    [
        (done(text="Hello."), "Hello.", "Hello.", "", "stop"),
        (done(text="Hello.", finish_reason="stop_string"), "He", "Hello.", "llo.", "stop"),
        (done(text="Hel", finish_reason="length"), "Hel", "Hel", "", "length"),
        (done(text="", finish_reason="moderated"), "Some text", "", None, "content_filter"),
        (done(text='```{"a": 1}```', json={"a": 1}), "", '{"a": 1}', '{"a": 1}', "stop"),
        (done(text="Sorry.", finish_reason="invalid"), "", "Sorry.", "Sorry.", "stop"),
        (
            done(text="Red, Blue,", finish_reason="cut"),
            "Red, Blue, Red, Blue",
            "Red, Blue,",
            "",
            "stop",
        ),
    ],
)
def test_finish_reasons_and_content_map_to_openais(event, shown, content, delta, finish):
    answer = answer_of(event, shown=shown)
    assert (answer.content, answer.delta, answer.finish_reason) == (content, delta, finish)
    assert answer.native_finish_reason == event["finish_reason"]


def test_an_answer_that_stayed_invalid_is_a_refusal():
    answer = answer_of(done(finish_reason="invalid", reason="$.answer: missing"), shown="")
    assert answer.content is None and "$.answer: missing" in answer.refusal


def test_an_override_adds_stops_caps_tokens_buffers_for_a_schema_and_is_recorded(settings):
    settings.CHAT_MAX_NEW_TOKENS_CAP = 64
    policy = ResolvedPolicy(
        id=1,
        slug="chat",
        version=3,
        mode="stream",
        sampling=SamplingParams(stop_strings=("\nUser:",)),
        system_prompt="Hi.",
    )
    assert overridden(policy, PolicyOverride(), SamplingChanges()) is policy
    schema = {"type": "object"}
    changed = overridden(
        policy,
        PolicyOverride(schema=schema),
        SamplingChanges(replaced={"temperature": 0.3}, stop_strings=(",",), max_new_tokens=10**6),
    )
    assert changed.mode == "buffer" and changed.schema == schema and changed.constrained
    assert changed.sampling.stop_strings == ("\nUser:", ",")
    assert changed.sampling.max_new_tokens == 64
    assert changed.system_prompt.startswith("Hi.") and '{"type":"object"}' in changed.system_prompt
    assert changed.overrides["max_new_tokens"] == 64 and changed.sampling.temperature == 0.3
    assert changed.overrides["stop_strings"] == ["\nUser:", ","] and changed.overrides["mode"]
    assert (changed.slug, changed.version) == (policy.slug, policy.version)


# Keys out of sorted order (and out of PostgreSQL jsonb's): they order the prompt and the grammar.
ORDERED_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "string"}, "city": {"type": "string"}},
    "required": ["zone", "city"],
}


@pytest.mark.parametrize(
    "extra",
    [
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "where",
                        "description": "Where it is.",
                        "parameters": ORDERED_PARAMETERS,
                    },
                }
            ],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "place", "schema": ORDERED_PARAMETERS},
            }
        },
        {},
    ],
)
def test_an_override_comes_back_from_its_json_as_it_was_given(extra):
    """What a Continue rebuilds from the stored text is the override the request made, down to
    its schema's key order, and applied it makes the same policy."""
    chat = parse(
        {
            "model": "smollm2",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            "stop": ["\n\n", ","],
            "max_tokens": 7,
            "temperature": 0.4,
            "seed": 3,
            "frequency_penalty": 0.5,
            **extra,
        }
    )
    text = settings_text(chat.override, chat.sampling)
    override, sampling = settings_of(text)
    assert (override, sampling) == (chat.override, chat.sampling)
    assert settings_text(override, sampling) == text
    policy = ResolvedPolicy(id=1, slug="chat", version=2, mode="stream", system_prompt="Hi.")
    applied = overridden(policy, chat.override, chat.sampling)
    reapplied = overridden(policy, override, sampling)
    assert reapplied == applied and policy_digest(reapplied) == policy_digest(applied)
    assert reapplied.system_prompt == applied.system_prompt  # the schema's keys in their order
    assert settings_text(None, None) == ""
    assert settings_of(settings_text(PolicyOverride(), None)) == (
        PolicyOverride(),
        SamplingChanges(),
    )


def test_a_policys_own_schema_wins_over_the_requests_and_stays_constrained():
    """A request never loosens a policy: its schema loses to the policy's, and asking for any
    schema (strict or not, json_object too) turns constrained decoding on, never off."""
    own = {"type": "object", "required": ["answer"]}
    policy = ResolvedPolicy(
        id=1, slug="json", version=1, mode="buffer", schema=own, constrained=False
    )
    changed = PolicyOverride(schema={"type": "object"}).apply(policy)
    assert changed.schema == own and changed.constrained and changed.mode == "buffer"
    assert '"required":["answer"]' in changed.system_prompt
    prose = ResolvedPolicy(id=2, slug="chat", version=1, mode="stream")
    asked = PolicyOverride(schema={"type": "object"}).apply(prose)
    assert asked.schema == {"type": "object"} and asked.constrained


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
        {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": False},
        },
    ],
)
def test_json_object_and_a_non_strict_schema_are_constrained(response_format):
    messages = [{"role": "user", "content": "Hi"}]
    chat = parse({"model": "smollm2", "messages": messages, "response_format": response_format})
    assert chat.override.schema == {"type": "object"}


def test_a_conversation_past_the_character_limit_is_refused():
    """Fitting a long conversation costs a tokenization per dropped turn: the total is bounded."""
    turns = [{"role": "user", "content": "x" * 1000}] * 70
    with pytest.raises(OpenAIError) as raised:
        parse({"model": "smollm2", "messages": turns})
    assert raised.value.code == "context_length_exceeded" and raised.value.param == "messages"


def test_a_content_chunk_from_its_template_is_the_chunk_built_whole():
    """The per-token fast path writes exactly what the chunk model would (any text: quotes,
    newlines, non-ASCII, a control character)."""
    import json as json_module

    from chat.transports.openai.replies import Delta
    from chat.transports.openai.views import _Reply

    chat = type("Chat", (), {"model": "smollm2:chat", "tools": None, "include_usage": False})()
    reply = _Reply(chat, "chatcmpl-1")  # type: ignore[arg-type]
    for text in ["Hello", ' "quoted"\n', "naïve — 猫 🦜", "\x00\x1f\\", ""]:
        fast, whole = reply.content_chunk(text), reply.chunk(delta=Delta(content=text))
        assert fast == whole
        assert (
            json_module.loads(fast.removeprefix("data: "))["choices"][0]["delta"]["content"] == text
        )


def test_an_answers_settings_stored_before_sampling_had_its_own_type_are_read_alike():
    """A Continue of an answer stored by the earlier code (one object, key order and all)
    applies the same settings as the request that made it would now."""
    stored = (
        '{"system_prompt":"Be brief.","schema":null,"stop_strings":[";"],"max_new_tokens":7,'
        '"sampling":{"temperature":0.4,"seed":3,"frequency_penalty":0.5},"tools":null}'
    )
    chat = parse(
        {
            "model": "smollm2",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            "stop": ";",
            "max_tokens": 7,
            "temperature": 0.4,
            "seed": 3,
            "frequency_penalty": 0.5,
        }
    )
    policy = ResolvedPolicy(id=1, slug="chat", version=2, mode="stream", system_prompt="Hi.")
    again = overridden(policy, *settings_of(stored))
    assert again == overridden(policy, chat.override, chat.sampling)
    assert again.sampling.temperature == 0.4 and again.sampling.stop_strings == (";",)
    assert json.loads(settings_text(chat.override, chat.sampling)) == json.loads(stored)


def test_sampling_changes_keep_a_float_settings_type_and_refuse_other_names():
    """An integer temperature is the float the answer's identity has always recorded; a name
    that is no setting, or one that is added to or capped, is refused where it is built."""
    chat = parse(
        {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Hi"}],
            "temperature": 1,
            "frequency_penalty": 1,
            "seed": 2,
        }
    )
    assert chat.sampling.replaced == {"seed": 2, "temperature": 1.0, "frequency_penalty": 1.0}
    assert all(type(v) is float for k, v in chat.sampling.replaced.items() if k != "seed")
    for name in ("temprature", "stop_strings", "max_new_tokens"):
        with pytest.raises(ValueError, match=name):
            SamplingChanges(replaced={name: 1})


def test_a_requests_decoding_settings_are_no_part_of_its_policy_override():
    """The stores type holds what changes the policy (prompt, schema, tools); every decoding
    setting a request brings is in SamplingChanges, so stores/ never reads one."""
    from dataclasses import fields

    decoding = {f.name for f in fields(SamplingParams)} | {"sampling"}
    assert not decoding & {f.name for f in fields(PolicyOverride)}
    chat = parse(
        {"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5}
    )
    assert chat.sampling.replaced == {"temperature": 0.5}
