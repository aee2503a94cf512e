"""Remote generation: where a token comes from when an OpenAI-compatible server makes it.

The backend in front of the server (`openai_backend`: prompts, counts, the request body), each
answer one streamed request over HTTP (`stream`), what that server accepts (`capabilities`), the
scheduler in front of it: one stream per slot, FIFO beyond (`concurrent`), and the optional Redis
queue every process shares (`global_queue`). No torch here: a web process on CHAT_BACKEND=openai
never loads it.
"""
