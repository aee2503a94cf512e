"""What the chat page shares with the server, served to it instead of copied into its script.

The page's modules (static/chat/page/) read this from a `chat-constants` JSON script tag, which the
browser never executes, so the strict CSP allows it (docs/development.md). A finish reason, a
close code or a limit changes here or where it is defined, and the page follows.
"""

from __future__ import annotations

from django.conf import settings

from .. import protocol
from ..models import Conversation, Message
from ..stores.conversations import MAX_TITLE
from ..transports.routing import WS_PATH

# How the page shows an answer by its finish_reason: its data-state and its badge (and whether
# the badge's tooltip gives the `done` event's reason).
FINISH_DISPLAY = {
    "eos": {"state": "done", "badge": ""},
    "stop_string": {"state": "done", "badge": ""},
    "length": {"state": "done", "badge": "Cut off (token limit)"},
    "cancelled": {"state": "cancelled", "badge": "Stopped"},
    protocol.INVALID: {"state": "invalid", "badge": "Invalid answer"},
    protocol.MODERATED: {"state": "retracted", "badge": "Withdrawn"},
    # At a loop or an invented turn: the answer's `reason` says which.
    protocol.CUT: {"state": "done", "badge": "Cut short", "reasonInTitle": True},
    # The server stopped mid-answer (a crash): the text saved as it grew stands; Continue offered.
    protocol.INTERRUPTED: {"state": "interrupted", "badge": "Interrupted"},
}

# A stored answer that did not end as `done` is shown by its status, whatever its finish_reason.
STATUS_DISPLAY = {
    str(Message.Status.CANCELLED): {"state": "cancelled", "badge": "Stopped"},
    str(Message.Status.FAILED): {"state": "error", "badge": "Failed"},
    str(Message.Status.INTERRUPTED): {"state": "interrupted", "badge": "Interrupted"},
    str(Message.Status.STREAMING): {"state": "streaming", "badge": ""},
}

# A `done` whose `reason` is one of these gets this badge instead of its finish_reason's.
REASON_BADGES = {
    protocol.SERVER_RESTARTING: "Stopped: the server restarted",
    protocol.NO_LISTENER: "Stopped: the page was closed",
}


def page_constants() -> dict:
    """The JSON the page reads at start (templates/chat/index.html)."""
    return {
        "finish": FINISH_DISPLAY,
        "status": STATUS_DISPLAY,
        "reasonBadges": REASON_BADGES,
        "continuable": protocol.CONTINUABLE,
        # What Continue takes: a finish_reason or, for an answer that did not end `done`, its status.
        "continuableReasons": list(protocol.CONTINUABLE_REASONS),
        # The page reconnects after any close; this one it names as a restart, and after the
        # end of its sign-in it reloads, as whoever the browser now is.
        "closeCodes": {
            "serverRestarting": protocol.CLOSE_SERVER_RESTARTING,
            "unauthorised": protocol.CLOSE_UNAUTHORISED,
        },
        "frameTypes": list(protocol.FRAME_TYPES),
        "eventTypes": list(protocol.EVENT_TYPES),
        "limits": {
            "maxPromptChars": settings.CHAT_MAX_PROMPT_CHARS,
            "maxTitleChars": MAX_TITLE,
            "titleFromPromptChars": Conversation.TITLE_FROM_PROMPT,
        },
        "wsPath": WS_PATH,
    }
