"""Hostile input: thousands of random frames, none of which may crash the consumer."""

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.protocol import Cancel, Ping, Prompt, ProtocolError, parse_frame
from harness.examples import fuzz_examples

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
frame_dicts = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["prompt", "cancel", "ping", "pong", "", "PROMPT"]) | json_values,
        "request_id": st.text(max_size=120) | json_values,
        "text": st.text(max_size=50) | json_values,
        "conversation": st.integers(-2, 10**12) | json_values,
        "policy": st.text(max_size=60) | json_values,
    },
)
# Deep nesting (the decoder recurses per level) and lone surrogates ("\\ud800": valid JSON, not UTF-8).
nested = st.builds(
    lambda depth, opener, value: opener * depth + value + {"[": "]", '{"a":': "}"}[opener] * depth,
    st.integers(1, 3000),
    st.sampled_from(["[", '{"a":']),
    st.sampled_from(["", "1", '"x"']),
)
surrogates = st.text(
    st.characters(categories=["Cs"]) | st.characters(),
    min_size=1,
    max_size=8,
)
hostile_frames = (
    nested
    | st.builds(
        lambda inner: '{"type": "prompt", "request_id": "n", "text": ' + inner + "}", nested
    )
    | st.fixed_dictionaries(
        {
            "type": st.just("prompt"),
            "request_id": st.text(max_size=4) | surrogates,
            "text": surrogates,
        },
        optional={"policy": surrogates, "conversation": st.none()},
    ).map(json.dumps)  # json.dumps writes a lone surrogate as its \\u escape
)
raw_frames = (
    hostile_frames
    | frame_dicts.map(json.dumps)
    | json_values.map(json.dumps)
    | st.text(min_size=1, max_size=200)
    | st.binary(min_size=1, max_size=64)
)  # a WebSocket frame is never empty (the test communicator refuses to send one)


@pytest.mark.unit
@settings(max_examples=fuzz_examples(3000), deadline=None, database=None)
@given(raw_frames)
def test_parse_frame_either_parses_or_raises_a_protocol_error(raw):
    """Any input is a command or a ProtocolError with a code and a message, never anything else."""
    text = None if isinstance(raw, bytes) else raw
    try:
        command = parse_frame(text, max_prompt_chars=100)
    except ProtocolError as exc:
        assert exc.code and exc.message
    else:
        assert isinstance(command, (Prompt, Cancel, Ping))


async def fire(application, frames) -> int:
    from tests.conftest import ChatClient

    client = await ChatClient(application).connect()
    answered = 0
    try:
        for raw in frames:
            if isinstance(raw, bytes):
                await client.communicator.send_to(bytes_data=raw)
            else:
                await client.communicator.send_to(text_data=raw)
            event = await client.receive(timeout=30)
            if event["type"] == "accepted":  # a frame that happened to be a valid prompt: stop it
                await client.send({"type": "cancel", "request_id": event["request_id"]})
                await client.receive_until("done", event["request_id"])
            else:
                assert event["type"] in {"error", "pong"}, event
                if event["type"] == "error":
                    assert event["code"] and event["message"]
            answered += 1
        await client.send({"type": "ping"})
        assert (await client.receive()) == {"type": "pong"}
    finally:
        await client.close()
    return answered


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(raw_frames, min_size=40, max_size=40))
def test_the_socket_survives_random_frames_and_answers_each(application, settings_rate, frames):
    """1,000 random frames over a real socket: each gets an answer, the connection stays usable."""
    assert asyncio.run(fire(application, frames)) == len(frames)


@pytest.fixture
def settings_rate(settings):
    settings.CHAT_MAX_PROMPT_CHARS = 100
