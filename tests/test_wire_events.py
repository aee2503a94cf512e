"""The typed server events serialize to the wire shapes of docs/protocol.md, key for key and in
order, and the one error-code table gives /api and /v1 the same status for every code."""

from __future__ import annotations

import json

import pytest

from chat.protocol import FINISH_REASONS, event_json, server_restarting_error
from chat.protocol import events as e
from chat.protocol.errors import ERROR_CODES, error_code
from chat.transports.openai import turn_error

pytestmark = pytest.mark.unit

METRICS = {"queue_ms": 1.0, "new_tokens": 3}


@pytest.mark.parametrize(
    ("event", "wire"),
    [
        (
            e.Accepted("r", conversation=1, message=2, queue_position=0),
            '{"type": "accepted", "request_id": "r", "conversation": 1, "message": 2, '
            '"queue_position": 0}',
        ),
        (
            e.Queued("r", queue_position=3),
            '{"type": "queued", "request_id": "r", "queue_position": 3}',
        ),
        (e.Chunk("r", "héllo"), '{"type": "chunk", "request_id": "r", "text": "héllo"}'),
        (e.Buffering("r", "json"), '{"type": "buffering", "request_id": "r", "reason": "json"}'),
        (e.Retract("r", "no"), '{"type": "retract", "request_id": "r", "reason": "no"}'),
        (
            e.Cut("r", text="a", reason="loop"),
            '{"type": "cut", "request_id": "r", "text": "a", "reason": "loop"}',
        ),
        (
            e.Done(
                "r",
                message=2,
                text="x",
                json_value={"a": 1},
                finish_reason="eos",
                cached=False,
                metrics=METRICS,
                reason=None,
                policy="chat",
            ),
            '{"type": "done", "request_id": "r", "message": 2, "text": "x", "json": {"a": 1}, '
            '"finish_reason": "eos", "cached": false, "metrics": {"queue_ms": 1.0, '
            '"new_tokens": 3}, "reason": null, "policy": "chat"}',
        ),
        (
            e.Error(None, "bad_json", "no"),
            '{"type": "error", "request_id": null, "code": "bad_json", "message": "no"}',
        ),
        (
            e.CancelAck("r", message=4, result="sent"),
            '{"type": "cancel_ack", "request_id": "r", "message": 4, "result": "sent"}',
        ),
        (e.Pong(), '{"type": "pong"}'),
    ],
)
def test_each_event_has_its_wire_shape(event, wire):
    assert event_json(event) == wire


def test_a_done_takes_only_a_known_finish_reason():
    assert [reason.value for reason in e.Finish] == list(FINISH_REASONS)
    with pytest.raises(ValueError, match="'sleepy' is not a valid Finish"):
        e.Done("r", 1, "", None, "sleepy", False, {}, None, "chat")


def test_the_server_restarting_error_is_an_error_event():
    assert json.loads(event_json(server_restarting_error("r")))["code"] == "server_restarting"


@pytest.mark.parametrize("code", [*ERROR_CODES, "some_new_code"])
def test_api_and_v1_give_a_code_the_same_status(code):
    assert turn_error(code, "m").status == error_code(code).status


def test_the_statuses_the_transports_once_disagreed_on():
    assert error_code("storage_failed").status == 503
    assert error_code("unknown_policy").status == 404
    assert turn_error("unknown_policy", "m").code == "model_not_found"
