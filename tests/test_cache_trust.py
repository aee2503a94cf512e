"""The shared cache cannot be poisoned: on the real model, real Redis and the database, what one
user made from a context only they held, or sampled, never reaches a stranger (docs/policies.md,
"What makes two answers the same")."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from chat.models import CachedAnswer, Message
from chat.stores.apikeys import apikey_create
from tests.test_consumer import new_session_key
from tests.test_http_api import HttpVisitor
from tests.test_openai_views import _user_with_key, post

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

QUESTION = "Count from 1 to 10, separated by commas."
# Greedy and cached; every answer of it ends at its first comma, space or line break, so a
# continued answer ends well (and would be cached) within a few tokens, whatever the wording.
COUNTING = dict(
    slug="counting", max_new_tokens=12, stop_strings=[",", " ", "\n"], cache_enabled=True
)


@pytest.fixture
def alice():
    return _user_with_key("alice")


@pytest.fixture
def counting(make_policy):
    return make_policy(**COUNTING)


def signed_in(name: str) -> tuple[str, str]:
    """A user's browser session key and API key."""
    user = get_user_model().objects.create_user(name)
    browser = Client()
    browser.force_login(user)
    return browser.cookies["sessionid"].value, apikey_create(user=user, name="test")[1]


async def hot_answer_cut_at_its_first_token(key: str) -> dict:
    """Over /v1: the user's own system prompt, sampled hot, cut after one token. A sample can
    end on a stop string at once; it is asked again until one is cut on length."""
    for _ in range(12):
        response, body = await post(
            key,
            {
                "model": "smollm2:counting",
                "messages": [
                    {"role": "system", "content": "Answer with random words."},
                    {"role": "user", "content": QUESTION},
                ],
                "temperature": 1.6,
                "max_tokens": 1,
            },
        )
        assert response.status_code == 200, body
        if body["choices"][0]["native_finish_reason"] == "length":
            return body
    raise AssertionError("twelve hot samples all ended before their first token's end")


async def continued_until_it_ends_well(key: str, continue_it) -> tuple[dict, dict]:
    """A hot answer continued, one Continue after another (each, as its request asked, one token
    long), until it ends on a stop string or eos (an answer cut on length is never cached, so it
    would prove nothing); sampled again from the start if it has not within eight. The
    caller's assertions then hold for the pair returned."""
    for _ in range(4):
        first = await hot_answer_cut_at_its_first_token(key)
        for _ in range(8):
            continued = await continue_it(first)
            if continued["finish_reason"] in ("stop_string", "eos"):
                return first, continued
    return first, continued


async def stranger_asks(application) -> dict:
    stranger = HttpVisitor(application, await new_session_key())
    status, done, _ = await stranger.post("/api/chat", {"text": QUESTION, "policy": "counting"})
    assert status == 200 and isinstance(done, dict), done
    return done


async def assert_nothing_of_it_is_shared(application, continued: dict, first: dict) -> None:
    message = await Message.objects.aget(pk=first["message_id"])
    assert message.identity == ""  # a context only its client held: never shared
    assert continued["finish_reason"] in ("stop_string", "eos"), continued  # it ended well
    assert not await CachedAnswer.objects.filter(answer=continued["text"]).aexists()
    done = await stranger_asks(application)
    assert done["cached"] is False  # the stranger's own answer, generated for them
    again = await stranger_asks(application)
    # ...which is then the one everybody shares.
    assert again["cached"] is True and again["text"] == done["text"]


async def test_a_v1_answer_continued_over_http_never_reaches_a_stranger(application, counting):
    """A user's /v1 answer (their own system prompt, temperature 1.6), continued from their
    browser session over /api, is not filed under the plain question: a stranger asking it
    plainly is generated their own answer, and the cache then holds that one."""
    session, key = await sync_to_async(signed_in)("mallory")
    browser = HttpVisitor(application, session)

    async def continue_it(first: dict) -> dict:
        status, continued, _ = await browser.post(
            "/api/chat", {"type": "continue", "message": first["message_id"]}
        )
        assert status == 200 and continued["message"] == first["message_id"], continued
        return continued

    first, continued = await continued_until_it_ends_well(key, continue_it)
    await assert_nothing_of_it_is_shared(application, continued, first)


async def test_a_v1_answer_continued_over_the_socket_never_reaches_a_stranger(
    application, counting, make_client
):
    """The same through the chat socket's `continue` frame."""
    session, key = await sync_to_async(signed_in)("trudy")
    chat = await make_client(session_key=session)

    async def continue_it(first: dict) -> dict:
        request_id = f"c{first['message_id']}-{chat.counter}"
        chat.counter += 1
        await chat.send(
            {"type": "continue", "request_id": request_id, "message": first["message_id"]}
        )
        continued = (await chat.receive_until("done", request_id))[-1]
        assert continued["message"] == first["message_id"], continued
        return continued

    first, continued = await continued_until_it_ends_well(key, continue_it)
    await assert_nothing_of_it_is_shared(application, continued, first)


TALLY = dict(slug="tally", max_new_tokens=24, stop_strings=["\n"], cache_enabled=True)
# The request's own settings over the policy's: one token at a time, ending at a comma.
OWN_SETTINGS = {
    "model": "smollm2:tally",
    "messages": [{"role": "user", "content": QUESTION}],
    "max_tokens": 1,
    "stop": [","],
}


async def cut_with_its_own_settings(key: str) -> tuple[dict, str]:
    """A /v1 answer made with the request's own max_tokens and stop (greedy, so shared under an
    identity that names them), cut on length; the answer and its identity."""
    response, first = await post(key, OWN_SETTINGS)
    assert response.status_code == 200 and first["choices"][0]["finish_reason"] == "length"
    identity = (await Message.objects.aget(pk=first["message_id"])).identity
    assert identity  # greedy, with no context of the client's: shareable
    return first, identity


async def continued_until_it_ends(chat, message_id: int) -> list[dict]:
    """Continued over the socket, one Continue after another, until one ends on its own."""
    done = []
    for attempt in range(8):
        request_id = f"c{attempt}"
        await chat.send({"type": "continue", "request_id": request_id, "message": message_id})
        done.append((await chat.receive_until("done", request_id))[-1])
        if done[-1]["finish_reason"] != "length":
            break
    assert done[-1]["finish_reason"] in ("stop_string", "eos"), done  # it ended well
    return done


@pytest.fixture
def engine_requests(monkeypatch) -> dict:
    """Each turn's GenerationRequest as it went to the engine, by its request id."""
    from chat.turns.run import TurnRun

    seen: dict = {}
    submit = TurnRun.submit

    def recording(self, request, **kwargs):
        seen[request.label] = request
        return submit(self, request, **kwargs)

    monkeypatch.setattr(TurnRun, "submit", recording)
    return seen


async def test_a_v1_answer_is_continued_with_its_requests_own_settings_and_cached_whole(
    application, make_policy, make_client, engine_requests
):
    """A /v1 answer made with the request's own max_tokens and stop, cut on length, continued
    from the user's socket: each continuation goes to the engine with that request's stop and
    max_tokens (not the policy's), and the finished whole is cached under the answer's identity,
    so a repeat of the request is served all of it."""
    await sync_to_async(make_policy)(**TALLY)
    session, key = await sync_to_async(signed_in)("uma")
    first, identity = await cut_with_its_own_settings(key)
    chat = await make_client(session_key=session)
    continued = await continued_until_it_ends(chat, first["message_id"])
    made_first = engine_requests[first["id"]].params
    for done in continued:
        params = engine_requests[done["request_id"]].params
        assert params.stop_strings == made_first.stop_strings == ("\n", ",")
        assert params.max_new_tokens == made_first.max_new_tokens == 1
    whole = (await Message.objects.aget(pk=first["message_id"])).text
    assert whole == continued[-1]["text"]
    message = await Message.objects.aget(pk=first["message_id"])
    assert message.identity == identity
    cached = await CachedAnswer.objects.aget(key=identity)
    assert cached.answer == whole
    response, again = await post(key, OWN_SETTINGS)
    assert response.status_code == 200 and again["cached"] is True
    assert again["choices"][0]["message"]["content"] == whole


async def test_a_v1_answer_stored_without_its_requests_settings_continued_is_never_cached(
    application, make_policy, make_client
):
    """An answer kept before its request's own settings were (or the policy changed since): the
    continuation cannot be made with them, so what it makes is never cached, nor shared, under
    the identity that named them."""
    await sync_to_async(make_policy)(**TALLY)
    session, key = await sync_to_async(signed_in)("vera")
    first, identity = await cut_with_its_own_settings(key)
    await Message.objects.filter(pk=first["message_id"]).aupdate(overrides="")
    chat = await make_client(session_key=session)
    await continued_until_it_ends(chat, first["message_id"])
    assert not await CachedAnswer.objects.filter(key=identity).aexists()
    assert (await Message.objects.aget(pk=first["message_id"])).identity == ""


async def test_a_sample_without_a_seed_is_generated_every_time(alice, runtime, example_policies):
    """temperature 1.2 and no seed, asked twice under the caching `chat` policy: generated both
    times, never cached or shared."""
    coalescer = runtime.stack.sharing

    joined = coalescer.joined
    ask = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        "temperature": 1.2,
        "max_tokens": 8,
    }
    for _ in range(2):
        response, body = await post(alice[1], ask)
        assert response.status_code == 200 and body["cached"] is False, body
        assert (await Message.objects.aget(pk=body["message_id"])).identity == ""
    assert not await CachedAnswer.objects.aexists() and coalescer.joined == joined


async def test_a_seed_makes_a_sample_reproducible_and_two_seeds_two_answers(
    alice, runtime, example_policies
):
    """With a seed the same request samples the same answer (then served from the cache when
    it ended well); another seed samples another answer."""

    async def sample(seed: int) -> dict:
        response, body = await post(
            alice[1],
            {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
                "temperature": 1.2,
                "max_tokens": 32,
                "seed": seed,
            },
        )
        assert response.status_code == 200, body
        return body

    first, again, other = await sample(11), await sample(11), await sample(12)
    text = [b["choices"][0]["message"]["content"] for b in (first, again, other)]
    assert text[0] == text[1] and text[0] != text[2]
    identities = [(await Message.objects.aget(pk=b["message_id"])).identity for b in (first, other)]
    assert all(identities) and identities[0] != identities[1]
    ended_well = first["choices"][0]["native_finish_reason"] in ("eos", "stop_string")
    assert again["cached"] is ended_well and other["cached"] is False
