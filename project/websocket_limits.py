"""daphne's WebSocket message limit, answered in the chat protocol instead of a bare drop.

The chat refuses a frame over MAX_FRAME_BYTES (64 KiB) with the `error` event
`frame_too_large`, and the socket stays open. daphne refuses a message over its own
`--websocket-max-message-size` (1 MiB by default, far above the chat's limit) before the
application sees it, and autobahn's default there is to drop the TCP connection: no close
frame, no reason. Installed from project/asgi.py (so under every daphne command line), this
makes such a message get the same `error` event `frame_too_large`, then the close code 1009
"message too big" (RFC 6455), documented in docs/protocol.md.
"""

from __future__ import annotations

import json

from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol

from chat.protocol import CLOSE_MESSAGE_TOO_BIG, error_fields


class TooBigAnsweredProtocol(WebSocketProtocol):
    """daphne's WebSocket protocol, saying why before it closes on an oversized message."""

    def _max_message_size_exceeded(self, msg_size, max_msg_size, reason) -> None:
        if self.state == self.STATE_OPEN and not self.failedByMe:
            event = error_fields(
                "frame_too_large",
                f"a message is limited to {max_msg_size} bytes; the socket closes "
                f"({CLOSE_MESSAGE_TOO_BIG})",
            )
            self.sendMessage(json.dumps(event).encode(), isBinary=False)
        # A close frame with 1009 (autobahn's hook sends it) instead of dropping the connection.
        self.failByDrop = False
        super()._max_message_size_exceeded(msg_size, max_msg_size, reason)


def install() -> None:
    """Every WebSocket daphne accepts from now on speaks through TooBigAnsweredProtocol."""
    WebSocketFactory.protocol = TooBigAnsweredProtocol
