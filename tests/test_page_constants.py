"""The page and the server agree: the constants the page's modules use are the server's own,
served in the page (chat/pages/page_constants.py), and the modules keep no copies of them."""

import json
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from chat import protocol
from chat.models import Conversation, Message
from chat.pages.page_constants import page_constants
from chat.protocol import events as e
from chat.stores.conversations import MAX_TITLE
from chat.transports.routing import websocket_urlpatterns

pytestmark = pytest.mark.unit

MODULES = Path(__file__).resolve().parent.parent / "static" / "chat" / "page"


def served(html: str, tag_id: str):
    match = re.search(rf'<script id="{tag_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no {tag_id} in the page"
    return json.loads(match.group(1))


@pytest.mark.django_db
def test_the_page_serves_the_servers_constants():
    html = Client().get("/").content.decode()
    constants = served(html, "chat-constants")
    assert constants == json.loads(json.dumps(page_constants()))
    assert constants["closeCodes"]["serverRestarting"] == protocol.CLOSE_SERVER_RESTARTING
    assert constants["closeCodes"]["unauthorised"] == protocol.CLOSE_UNAUTHORISED
    assert constants["limits"] == {
        "maxPromptChars": settings.CHAT_MAX_PROMPT_CHARS,
        "maxTitleChars": MAX_TITLE,
        "titleFromPromptChars": Conversation.TITLE_FROM_PROMPT,
    }
    assert f'maxlength="{MAX_TITLE}"' in html  # the rename box
    assert served(html, "chat-config") == {"conversation": None}


def test_every_finish_reason_and_stored_status_has_a_display():
    constants = page_constants()
    assert set(constants["finish"]) == set(protocol.FINISH_REASONS)
    assert set(constants["status"]) == set(Message.Status.values) - {Message.Status.DONE}
    assert constants["continuable"] in protocol.FINISH_REASONS
    assert set(constants["reasonBadges"]) == {protocol.SERVER_RESTARTING, protocol.NO_LISTENER}
    assert set(constants["continuableReasons"]) >= {protocol.CONTINUABLE, protocol.INTERRUPTED}


def test_the_served_type_names_are_what_the_protocol_builds_and_parses():
    built = [
        protocol.event_fields(event)
        for event in (
            e.Accepted("r", conversation=1, message=2, queue_position=0),
            e.Queued("r", queue_position=1),
            e.Reading("r", tokens_read=128, prompt_tokens=512),
            e.Chunk("r", "x"),
            e.Buffering("r", "checking"),
            e.Retract("r", "no"),
            e.Cut("r", text="x", reason="loop"),
            e.Done(
                "r",
                message=2,
                text="x",
                json_value=None,
                finish_reason=e.Finish.EOS,
                cached=False,
                metrics={},
                reason=None,
                policy="default",
            ),
            e.Error(None, "bad_json", "no"),
            e.CancelAck("r", message=2, result="finished"),
            e.Pong(),
        )
    ]
    assert [event["type"] for event in built] == list(protocol.EVENT_TYPES)
    frames = {
        "prompt": {"request_id": "r", "text": "hi"},
        "continue": {"request_id": "r", "message": 2},
        "cancel": {"request_id": "r"},
        "ping": {},
        "resume": {"message": 2, "after": 0},
    }
    assert list(frames) == list(protocol.FRAME_TYPES)
    for kind, fields in frames.items():
        protocol.parse_frame(json.dumps({"type": kind, **fields}), max_prompt_chars=10)
    served_constants = page_constants()
    assert served_constants["eventTypes"] == list(protocol.EVENT_TYPES)
    assert served_constants["frameTypes"] == list(protocol.FRAME_TYPES)


def test_the_served_socket_path_is_the_routed_one():
    path = page_constants()["wsPath"]
    assert [p.pattern.match(path.removeprefix("/")) is not None for p in websocket_urlpatterns] == [
        True
    ]


def test_a_new_conversations_title_is_its_first_prompt_cut_to_the_served_length():
    text = "  many   words\n" + "x" * 200
    title = Conversation.title_from_prompt(text)
    assert title.startswith("many words x") and len(title) == Conversation.TITLE_FROM_PROMPT


def test_the_modules_keep_no_copy_of_a_served_value():
    """A label, close code or limit written into a module would stop following the server."""
    source = "\n".join(p.read_text() for p in sorted(MODULES.glob("*.js")))
    constants = page_constants()
    labels = {d["badge"] for d in constants["finish"].values()}
    labels |= {d["badge"] for d in constants["status"].values()}
    labels |= set(constants["reasonBadges"].values())
    for label in labels - {""}:
        assert f"'{label}'" not in source and f'"{label}"' not in source, label
    limits = constants["limits"]
    numbers = [*constants["closeCodes"].values(), limits["maxPromptChars"], limits["maxTitleChars"]]
    for number in numbers:
        assert not re.search(rf"\b{number}\b", source), number
    assert constants["wsPath"] not in source
