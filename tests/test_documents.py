"""A pasted document: 20,000 characters reach the model whole over the socket, /api and /v1.

The model is read as much of the prompt as the default limit allows (the context less the
answer's room), in chunks that report progress; what a 135M model makes of it is not asserted
(its wording depends on the CPU), only that it read all of it and answered.

The three transports ask about the same document in one process, and the prefix store is made
big enough to keep its KV: the socket's answer reads it in chunks, the others find it stored
and read only their question (each still counts every prompt token, so a transport that cut
the document short would show, and would be read anew from where it differs).
"""

from __future__ import annotations

import random

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from chat.models import Message
from chat.stores.apikeys import apikey_create
from tests.test_consumer import new_session_key
from tests.test_http_api import HttpVisitor

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

FACT = "The harbour light of Varnholm was painted green in 1872."
WORDS = [
    "the",
    "town",
    "keeps",
    "its",
    "ledgers",
    "in",
    "the",
    "old",
    "customs",
    "house",
    "where",
    "merchants",
    "once",
    "weighed",
    "salt",
    "and",
    "herring",
    "before",
    "the",
    "ships",
    "left",
    "for",
    "the",
    "northern",
    "markets",
    "each",
    "spring",
    "while",
    "the",
    "council",
    "argued",
    "about",
    "tolls",
    "bridges",
    "wells",
    "and",
    "the",
    "price",
    "of",
    "rope",
]


def document(chars: int = 20_000) -> str:
    """About `chars` characters of plain prose with FACT in the middle (seeded: the same text
    every run)."""
    rng = random.Random(7)
    sentences: list[str] = []
    while sum(len(s) + 1 for s in sentences) < chars:
        sentences.append(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + "."
        )
    sentences.insert(len(sentences) // 2, FACT)
    return " ".join(sentences)


def ask(question: str) -> str:
    return f"Read this report, then answer the question after it.\n\n{document()}\n\n{question}"


@pytest.fixture(scope="module", autouse=True)
def document_kv_kept(backend):
    """The prefix store holds the document's KV (hundreds of MB, over its default budget) for
    this module, then gives it back: later modules see the store as they always do."""
    store = backend.prefix_store
    budget = store.max_bytes
    store.max_bytes = max(budget, 1024 * 1024 * 1024)
    yield
    store.max_bytes = budget
    store.clear()


def test_the_document_is_over_the_old_limits_and_within_the_new_ones(backend, settings):
    from chat.turns.prepare import prompt_token_limit

    text = ask("When was the harbour light painted?")
    assert 20_000 <= len(text) <= settings.CHAT_MAX_PROMPT_CHARS
    assert 3_500 < backend.token_count(text) <= prompt_token_limit(backend) < backend.context_length
    assert prompt_token_limit(backend) >= 6_000  # the bundled model's 8,192 less the answer's room


async def test_a_document_over_the_socket_is_read_with_progress_and_answered(
    client, backend, settings
):
    settings.CHAT_MAX_NEW_TOKENS = 8
    text = ask("What colour was the harbour light painted?")
    request_id = await client.prompt(text)
    events = await client.receive_until("done", request_id, timeout=300)
    reading = [e for e in events if e["type"] == "reading"]
    assert reading, [e["type"] for e in events]
    read = [e["tokens_read"] for e in reading]
    assert read == sorted(read) and all(
        e["prompt_tokens"] == reading[0]["prompt_tokens"] for e in reading
    )
    done = events[-1]
    assert done["finish_reason"] in ("eos", "length", "stop") and done["text"].strip()
    assert done["metrics"]["prompt_tokens"] >= backend.token_count(text)
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert (
        message.status == "done"
        and message.metrics["prompt_tokens"] == done["metrics"]["prompt_tokens"]
    )
    user = await sync_to_async(Message.objects.get)(
        conversation_id=message.conversation_id, role="user"
    )
    assert user.text == text  # kept whole


async def test_a_document_over_the_http_api_is_answered(application, backend, settings):
    settings.CHAT_MAX_NEW_TOKENS = 8
    visitor = HttpVisitor(application, await new_session_key())
    text = ask("In which year was the harbour light painted?")
    status, done, _ = await visitor.post("/api/chat", {"text": text})
    assert status == 200, done
    assert done["type"] == "done" and done["text"].strip()
    assert done["metrics"]["prompt_tokens"] >= backend.token_count(text)


async def test_a_document_over_v1_is_answered(application, backend):
    """The official client's request, sent to the application in process (the socket and /api
    tests' process, whose store has the document; tests/test_openai_api.py covers daphne)."""
    user = await sync_to_async(get_user_model().objects.create_user)("alice")
    key = (await sync_to_async(apikey_create)(user=user, name="document"))[1]
    text = ask("Which town's harbour light is the report about?")
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, timeout=300) as http:
        client = openai.AsyncOpenAI(
            base_url="http://localhost/v1", api_key=key, max_retries=0, http_client=http
        )
        answer = await client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": text}], max_tokens=8
        )
    assert answer.choices[0].message.content
    assert answer.usage.prompt_tokens >= backend.token_count(text)
