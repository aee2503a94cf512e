"""daphne's connections send a write at once while nothing is buffered, and keep Twisted's
buffering (in order) for whatever the socket does not take (project/socket_writes.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from twisted.internet import protocol, tcp

from harness.liveserver import free_port
from project.socket_writes import WriteThroughServer

ROOT = Path(__file__).resolve().parent.parent


class Reactor:
    """What a transport asks of its reactor, recorded: is it waiting to write?"""

    def __init__(self):
        self.writers: set = set()

    def addReader(self, reader):  # noqa: N802 (Twisted's names)
        pass

    def removeReader(self, reader):  # noqa: N802
        pass

    def addWriter(self, writer):  # noqa: N802
        self.writers.add(writer)

    def removeWriter(self, writer):  # noqa: N802
        self.writers.discard(writer)


@pytest.fixture
def connection():
    ours, peer = socket.socketpair()
    reactor = Reactor()
    transport = WriteThroughServer(ours, protocol.Protocol(), ("127.0.0.1", 1), None, 0, reactor)
    peer.settimeout(5)
    yield transport, peer, reactor
    ours.close()
    peer.close()


def read_all(peer: socket.socket, size: int, transport=None) -> bytes:
    """`size` bytes from the peer, letting `transport` flush its buffer as a reactor would."""
    received = bytearray()
    while len(received) < size:
        if transport is not None and transport.reactor.writers:
            transport.doWrite()
        received += peer.recv(1 << 20)
    return bytes(received)


@pytest.mark.unit
def test_a_write_on_an_idle_connection_is_sent_at_once(connection):
    transport, peer, reactor = connection
    transport.write(b"data: one\n\n")
    transport.writeSequence([b"b\r\n", b"data: two\n\n", b"\r\n"])
    assert not reactor.writers  # nothing waited for the loop
    assert read_all(peer, 11 + 16) == b"data: one\n\nb\r\ndata: two\n\n\r\n"


@pytest.mark.unit
def test_what_the_socket_does_not_take_is_buffered_and_sent_in_order(connection):
    transport, peer, reactor = connection
    pieces = [bytes([n % 251]) * 65_536 for n in range(160)]  # 10 MiB: past any socket buffer
    for piece in pieces:
        transport.write(piece)
    assert reactor.writers == {transport}  # the rest waits for the socket, as Twisted's does
    assert transport._tempDataLen or len(transport.dataBuffer) > transport.offset
    head = peer.recv(65_536)  # the socket has room again, while Twisted's buffer waits
    transport.write(b"the end")  # behind that buffer, never ahead of it
    expected = b"".join(pieces) + b"the end"
    assert head + read_all(peer, len(expected) - len(head), transport) == expected
    assert not reactor.writers


@pytest.mark.unit
def test_a_closing_connection_writes_through_twisted_as_before(connection):
    transport, peer, reactor = connection
    transport.loseConnection()  # no bytes waiting: Twisted closes on the next doWrite
    transport.write(b"late")
    assert reactor.writers == {transport}
    assert transport._tempDataLen == 4  # in Twisted's buffer, not sent past its close


@pytest.mark.unit
def test_a_reset_peer_is_left_to_twisted(connection):
    transport, peer, reactor = connection
    peer.close()
    transport.write(b"x" * 10)  # a Unix socket pair refuses it at once (EPIPE)
    transport.write(b"y" * 10)
    assert transport.connected  # no exception here: Twisted's doWrite meets the error
    assert reactor.writers == {transport} and transport._tempDataLen == 20
    assert transport.doWrite() is not None  # and reports the connection lost


@pytest.mark.integration
def test_the_product_installs_it_for_every_daphne_connection():
    import project.asgi  # noqa: F401 (installs it, as under every daphne command line)

    assert tcp.Port.transport is WriteThroughServer


APP = """
from project import socket_writes
socket_writes.install()

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for n in range(PIECES):
        await send({"type": "http.response.body", "body": b"%08d" % n * 1024, "more_body": True})
    await send({"type": "http.response.body", "body": b"end"})
"""


@pytest.mark.integration
def test_a_slow_client_gets_every_byte_of_a_large_stream_through_daphne(tmp_path):
    """A chunked response of 4,000 writes of 8 KiB (32 MiB) to a client that reads nothing
    for a second, then everything: the socket's buffer fills, the rest queues in order."""
    pieces = 4000
    (tmp_path / "bulk_app.py").write_text(APP.replace("PIECES", str(pieces)))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "bulk_app:app"],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()
                assert time.monotonic() < deadline, "daphne did not start"
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as response:
            time.sleep(1)  # the server writes on while nobody reads
            body = response.read()
    finally:
        server.terminate()
        server.wait(10)
    expected = b"".join(b"%08d" % n * 1024 for n in range(pieces)) + b"end"
    assert len(body) == len(expected)
    assert body == expected
