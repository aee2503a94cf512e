"""How clients reach a chat turn: the socket consumer, the HTTP API (/api), the OpenAI-compatible
API (/v1) and the page's views. Each parses its input, calls `chat.turns.admit`, and serializes the
typed events it is handed; none imports another transport."""
