"""daphne's TCP connections send at once when nothing is waiting, instead of on the next loop turn.

Twisted's transports buffer every write and send it when the event loop reports the socket
writable: for each write, an `add_writer` (an epoll_ctl), a loop turn, the reactor's logging
context around `doWrite`, the `send`, then a `remove_writer` (another epoll_ctl). A streamed
answer writes once per token, so that round trip through the loop cost about as much Python as
the token's own work. asyncio's transports send at once when their buffer is empty; this does
the same for daphne: a write on a connection with nothing buffered goes straight to `send`, and
only what the socket does not take now (a slow client, a full send buffer) is buffered and sent
by Twisted as before, in order. The bytes on the wire are the same. Installed from
project/asgi.py, so every daphne command line (`make run`, runserver, the tests' live daphne)
serves through it.
"""

from __future__ import annotations

from collections.abc import Iterable

from twisted.internet import tcp


class WriteThroughServer(tcp.Server):
    """A TCP server connection whose writes go out at once while nothing is buffered."""

    def write(self, data: bytes) -> None:
        rest = self._send_now(data)
        if rest:
            super().write(rest)

    def writeSequence(self, iovec: Iterable[bytes]) -> None:
        # daphne's chunked body is a three-piece sequence (size, data, CRLF): one send, not three.
        self.write(b"".join(iovec))

    def _send_now(self, data: bytes) -> bytes:
        """Sends what the socket takes now, when nothing waits in Twisted's buffer (so the order
        is kept) and the connection is plain, open TCP; returns what is left to buffer."""
        if (
            not data
            or self.TLS
            or not self.connected
            or self.disconnecting
            or self._writeDisconnected
            or self._tempDataLen
            or self.offset < len(self.dataBuffer)
        ):
            return data
        try:
            sent = self.socket.send(data)
        except OSError:
            # A full socket (EAGAIN) is Twisted's to wait for; a reset or closed peer is met
            # again by Twisted's next `doWrite`, which closes the connection as it always does.
            return data
        return data[sent:]


def install() -> None:
    """Every TCP connection accepted from now on writes through WriteThroughServer."""
    tcp.Port.transport = WriteThroughServer
