"""How clients reach a chat turn, and only that: the socket consumer (and its route and origin
check), the HTTP API (/api, with the SSE feed it shares with /v1), and the OpenAI-compatible API
(/v1, the wire and its views in openai/). Each parses its input, calls `chat.turns.admit`, and
serializes the typed events it is handed; none imports another transport."""
