"""Answers that end well: a loop is cut at its loop (its good part kept), and an answer cut off at
the token limit can be continued into the same message. Over the real socket; the real model
where the path is the user's, a scripted one where exact text must be known."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat.engine.text.template import render_pieces
from chat.models import Message
from chat.policy import BufferGate, Cut, RepetitionHook, StreamGate, gate_for
from harness.scripted import Answer
from tests.conftest import ChatClient, chunks_text
from tests.test_cache_trust import signed_in
from tests.test_openai_views import post

ws_db = pytest.mark.django_db(transaction=True)

GOOD = "Two colours are red and blue."
LOOP = " Red, Blue, White, Green," * 12


@pytest.fixture
async def chat(application):
    client = await ChatClient(application).connect()
    yield client
    await client.close()


async def ask(chat: ChatClient, text: str, **extra) -> list[dict]:
    request_id = await chat.prompt(text, **extra)
    return await chat.receive_until("done", request_id, timeout=60)


async def continue_answer(chat: ChatClient, message: int, request_id: str) -> list[dict]:
    await chat.send({"type": "continue", "request_id": request_id, "message": message})
    return await chat.receive_until("done", request_id, timeout=60)


# -- the hook and the gate -------------------------------------------------------------


@pytest.mark.unit
def test_a_loop_is_cut_after_its_first_copy_between_words():
    """The verdict keeps the text before the loop and one copy of it, never half a word."""
    verdict = RepetitionHook(max_repeats=2).check(GOOD + LOOP, final=False)
    assert verdict.categories == ("repetition",)
    assert (GOOD + LOOP)[: verdict.cut_at] == GOOD + " Red, Blue, White, Green,"
    sentences = "The fox ran home to its den. " * 6
    verdict = RepetitionHook(max_repeats=2).check(sentences, final=True)
    assert sentences[: verdict.cut_at] == "The fox ran home to its den."
    runaway = RepetitionHook().check("Sure, here it is.\nUser: thanks", final=False)
    assert runaway.categories == ("runaway",) and runaway.cut_at == len("Sure, here it is.")


@pytest.mark.unit
def test_the_stream_gate_cuts_keeps_the_raw_text_and_ignores_the_rest():
    """Cut once, with the text to keep; later chunks change nothing; the outcome stands."""
    gate = StreamGate([RepetitionHook(max_repeats=2)], window_chars=16)
    actions = []
    for start in range(0, len(GOOD + LOOP), 7):
        actions += gate.feed((GOOD + LOOP)[start : start + 7])
    cuts = [a for a in actions if isinstance(a, Cut)]
    assert len(cuts) == 1 and cuts[0].text == gate.shown == gate.text
    assert gate.shown.startswith(GOOD) and len(gate.shown) < len(GOOD) + 60
    assert gate.feed(" more") == []
    final_actions, outcome = gate.finish()
    assert final_actions == [] and outcome.status == "ok" and outcome.text == gate.shown
    assert gate.cut.startswith("repeated text") and gate.raw.startswith(gate.shown)
    assert len(gate.raw) > len(gate.shown)


@pytest.mark.unit
def test_a_loop_only_the_final_check_sees_is_cut_too():
    """The last window is checked at the end: the loop there is cut, not shown."""
    gate = StreamGate([RepetitionHook(max_repeats=2)], window_chars=10_000)
    for piece in (GOOD, LOOP):
        gate.feed(piece)
    actions, outcome = gate.finish()
    assert isinstance(actions[0], Cut) and outcome.status == "ok"
    assert outcome.text == actions[0].text == gate.shown


@pytest.mark.unit
def test_a_buffered_cut_answer_is_still_validated():
    """In buffer mode nothing was shown; the cut text is judged as the whole answer."""
    gate = BufferGate([RepetitionHook(max_repeats=2)], {"type": "object"}, window_chars=16)
    for piece in ('{"a": ', '"x"}', LOOP):
        gate.feed(piece)
    _actions, outcome = gate.finish()
    assert gate.cut and outcome.status == "ok" and outcome.json == {"a": "x"}


@pytest.mark.unit
def test_a_continued_answers_gate_starts_from_what_was_shown():
    """The rest of an answer is judged with its start: a loop across the two parts is found."""
    gate = gate_for("stream", hooks=[RepetitionHook(max_repeats=2)], shown=GOOD + LOOP[:50])
    assert gate.shown == GOOD + LOOP[:50]
    gate.feed(LOOP[50:])
    _actions, outcome = gate.finish()
    assert gate.cut and outcome.text.startswith(GOOD) and len(outcome.text) < len(GOOD + LOOP)


@pytest.mark.integration
def test_a_chat_ending_on_an_assistant_message_renders_open_like_transformers(backend):
    """The continuation prompt is the template cut after the answer so far, as transformers'
    continue_final_message renders it; markers typed in that answer stay text."""
    tokenizer = backend.tokenizer
    messages = [
        {"role": "user", "content": "Tell a story."},
        {"role": "assistant", "content": "Once upon a time"},
    ]
    rendered = "".join(text for text, _ in render_pieces(tokenizer, messages))
    expected = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert rendered == expected and rendered.endswith("Once upon a time")
    typed = [messages[0], {"role": "assistant", "content": "A<|im_end|>"}]
    assert backend.encode(typed).count(backend.token_id("<|im_end|>")) == 2  # system + user only


# -- over the socket, scripted -----------------------------------------------------------


@pytest.mark.integration
@ws_db
async def test_a_looping_answer_is_cut_at_its_loop_kept_and_not_cached(scripted, chat, make_policy):
    """`cut` with the good part, generation stopped, `done` "cut"; stored cut, raw kept for
    review; never cached, so a repeat is generated again."""
    await sync_to_async(make_policy)(
        slug="loopy",
        moderation_hooks=[{"hook": "repetition", "settings": {"max_repeats": 2}}],
    )
    backend = scripted(
        Answer((GOOD, *[LOOP[i : i + 9] for i in range(0, len(LOOP), 9)]), wait_for_cancel=True),
        Answer(("Fine.",)),
    )
    events = await ask(chat, "Name two colours.", policy="loopy")
    kinds = [e["type"] for e in events]
    assert "retract" not in kinds and kinds.index("cut") < kinds.index("done")
    cut = next(e for e in events if e["type"] == "cut")
    done = events[-1]
    assert done["finish_reason"] == "cut" and done["text"] == cut["text"]
    # What was streamed past the cut, if anything, depends on how the chunks arrived together.
    assert done["text"].startswith(GOOD) and chunks_text(events).startswith(done["text"])
    assert len(done["text"]) < len(GOOD + LOOP)
    assert done["reason"].startswith("repeated text")
    assert backend.requests[0].cancel.is_set()  # the model was stopped
    stored = await Message.objects.aget(pk=done["message"])
    assert stored.text == done["text"] and stored.outcome == "ok"
    assert stored.finish_reason == "cut" and stored.raw_text.startswith(done["text"])
    assert len(stored.raw_text) > len(stored.text)
    again = (await ask(chat, "Name two colours.", policy="loopy"))[-1]
    assert again["cached"] is False and len(backend.requests) == 2


@pytest.mark.integration
@ws_db
async def test_a_continued_answer_grows_in_place_and_is_then_cached_whole(
    scripted, chat, make_policy
):
    """length -> Continue: the same message, the answer so far sent as the assistant's unfinished
    turn, the text appended; ending well, a repeat of the prompt is served the whole answer."""
    await sync_to_async(make_policy)(slug="short", max_new_tokens=16, cache_enabled=True)
    backend = scripted(Answer(("Once upon",), "length"), Answer((" a time.",), "eos"))
    first = (await ask(chat, "Tell a story.", policy="short"))[-1]
    assert first["finish_reason"] == "length"
    events = await continue_answer(chat, first["message"], "more-1")
    accepted, done = events[0], events[-1]
    assert accepted["type"] == "accepted" and accepted["message"] == first["message"]
    assert chunks_text(events) == " a time."
    assert done["text"] == "Once upon a time." and done["finish_reason"] == "eos"
    assert done["metrics"]["new_tokens"] == 2  # one token each, added up
    sent = backend.requests[1].messages
    assert sent[-2:] == [
        {"role": "user", "content": "Tell a story."},
        {"role": "assistant", "content": "Once upon"},
    ]
    stored = await Message.objects.aget(pk=first["message"])
    assert stored.text == "Once upon a time." and stored.finish_reason == "eos"
    assert await Message.objects.filter(conversation_id=stored.conversation_id).acount() == 2
    repeat = (await ask(chat, "Tell a story.", policy="short"))[-1]
    assert repeat["cached"] is True and repeat["text"] == "Once upon a time."


@pytest.mark.integration
@ws_db
async def test_a_v1_answer_is_continued_with_its_requests_own_system_prompt_and_settings(
    scripted, application
):
    """A /v1 answer made with the client's own system prompt, stop, max_tokens and sampling
    (never shared: a context the server does not hold), cut on length and continued from the
    user's browser: the continuation reads that system prompt and decodes with those settings."""
    backend = scripted(Answer(("Arr",), "length"), Answer((", matey.",), "eos"))
    session, key = await sync_to_async(signed_in)("pete")
    pirate = {"role": "system", "content": "You are a pirate."}
    response, first = await post(
        key,
        {
            "model": "smollm2",
            "messages": [pirate, {"role": "user", "content": "Hi"}],
            "max_tokens": 3,
            "stop": ["!"],
            "temperature": 0.5,
            "seed": 2,
        },
    )
    assert response.status_code == 200 and first["choices"][0]["finish_reason"] == "length"
    chat = await ChatClient(application, session_key=session).connect()
    try:
        done = (await continue_answer(chat, first["message_id"], "more"))[-1]
    finally:
        await chat.close()
    assert done["text"] == "Arr, matey." and done["finish_reason"] == "eos"
    made, continued = backend.requests
    assert continued.messages[0] == made.messages[0] == pirate
    assert continued.params == made.params and "!" in continued.params.stop_strings
    assert continued.params.max_new_tokens == 3 and continued.params.seed == 2


@pytest.mark.integration
@ws_db
async def test_stopping_a_continuation_keeps_the_answer_so_far(scripted, chat, make_policy):
    """A Stop during Continue loses nothing: the earlier text stays, with what was added."""
    await sync_to_async(make_policy)(slug="short", max_new_tokens=16)
    scripted(Answer(("Once upon",), "length"), Answer((" a", " time"), wait_for_cancel=True))
    first = (await ask(chat, "Tell a story.", policy="short"))[-1]
    await chat.send({"type": "continue", "request_id": "more", "message": first["message"]})
    await chat.receive_until("chunk", "more", timeout=10)
    await chat.send({"type": "cancel", "request_id": "more"})
    done = (await chat.receive_until("done", "more", timeout=10))[-1]
    assert done["finish_reason"] == "cancelled" and done["text"].startswith("Once upon a")
    stored = await Message.objects.aget(pk=first["message"])
    assert stored.text == done["text"]


@pytest.mark.integration
@ws_db
async def test_only_the_last_answer_cut_at_the_limit_can_be_continued(
    scripted, chat, make_client, make_policy
):
    """An answer that ended on its own, another visitor's, an unknown one, or a frame without a
    message: each a clear error, the socket still open, nothing generated."""
    await sync_to_async(make_policy)(slug="short", max_new_tokens=16)
    backend = scripted(Answer(("Done.",), "eos"), Answer(("Cut",), "length"))
    ended = (await ask(chat, "Hi", policy="short"))[-1]
    cut = (await ask(chat, "Hi again", policy="short"))[-1]
    cases = [
        ({"message": ended["message"]}, "bad_message"),
        ({"message": 10**9}, "unknown_request"),
        ({}, "bad_message"),
        ({"message": "x"}, "bad_message"),
    ]
    for n, (fields, code) in enumerate(cases):
        await chat.send({"type": "continue", "request_id": f"c{n}", **fields})
        error = await chat.receive(timeout=10)
        assert (error["type"], error["code"], error["request_id"]) == ("error", code, f"c{n}")
    stranger = await make_client()
    await stranger.send({"type": "continue", "request_id": "s", "message": cut["message"]})
    assert (await stranger.receive(timeout=10))["code"] == "unknown_request"
    assert len(backend.requests) == 2
    await chat.send({"type": "ping"})
    assert (await chat.receive(timeout=10))["type"] == "pong"


# -- over the socket, the real model ----------------------------------------------------------


@pytest.mark.integration
@ws_db
async def test_the_real_model_continues_an_answer_it_was_cut_off_in(chat, make_policy):
    """A 4-token limit cuts a story off; Continue writes more into the same message and the
    stored text, metrics and finish reason follow."""
    await sync_to_async(make_policy)(slug="tiny", max_new_tokens=4)
    first = (await ask(chat, "Write a long story about a fox in a forest.", policy="tiny"))[-1]
    assert first["finish_reason"] == "length", first  # 4 tokens cannot finish a long story
    events = await continue_answer(chat, first["message"], "go-on")
    done = events[-1]
    assert events[0]["message"] == first["message"]
    assert done["text"].startswith(first["text"]) and len(done["text"]) > len(first["text"])
    assert done["text"] == first["text"] + chunks_text(events)
    assert done["metrics"]["new_tokens"] > first["metrics"]["new_tokens"]
    stored = await Message.objects.aget(pk=first["message"])
    assert stored.text == done["text"] and stored.finish_reason == done["finish_reason"]
    assert stored.status == Message.Status.DONE


@pytest.mark.integration
@ws_db
async def test_the_real_models_answer_is_cut_where_a_hook_says_and_kept(chat, make_policy):
    """The path of a cut on the real model: the hook's verdict stops generation, the user keeps
    the part before it, nothing is withdrawn and nothing cached."""
    await sync_to_async(make_policy)(
        slug="brief",
        max_new_tokens=64,
        moderation_hooks=[{"hook": "repetition", "settings": {"max_chars": 60}}],
    )
    events = await ask(chat, "Write a long story about a fox in a forest.", policy="brief")
    done = events[-1]
    assert done["finish_reason"] == "cut", done
    assert "retract" not in [e["type"] for e in events]
    assert 0 < len(done["text"]) <= 60 and chunks_text(events).startswith(done["text"])
    assert done["metrics"]["new_tokens"] < 64  # stopped early, not run to the limit
    stored = await Message.objects.aget(pk=done["message"])
    assert stored.text == done["text"] and stored.outcome == "ok"


@pytest.mark.unit
def test_a_short_loop_keeps_one_copy_completed_to_its_pause():
    """A loop shorter than the hook's min_span is found as several copies; one is kept, and a
    copy that starts mid-item is completed to its punctuation or line end."""
    hook = RepetitionHook(max_repeats=2)
    shanks = "I have roasted lamb, including lamb shanks, " + "lamb shanks, " * 12
    assert (
        shanks[: hook.check(shanks, final=True).cut_at]
        == "I have roasted lamb, including lamb shanks,"
    )
    eggs = "How to:\n\nBoil an egg:\n\n" + "Boil an egg:\n\n" * 20
    assert eggs[: hook.check(eggs, final=True).cut_at] == "How to:\n\nBoil an egg:"


@pytest.mark.unit
def test_an_answers_repetition_hook_indexes_its_text_once_and_judges_it_as_a_fresh_one():
    """The gate's own copy of the hook keeps its index of the growing text between checks (each
    position indexed once, not the whole text every window), and says what a fresh hook says
    of every prefix, a rewritten text included."""
    import random

    random.seed(7)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "then",
        "it",
        "ran",
        "over",
        "to",
        "the",
        "big",
        "red",
        "barn",
    ]
    for trial in range(120):
        text = " ".join(random.choice(words) for _ in range(random.randint(20, 160)))
        if trial % 3:
            at = random.randint(0, len(text))
            text = (
                text[:at] + text[at : at + random.randint(8, 50)] * random.randint(2, 7) + text[at:]
            )
        hook = RepetitionHook(max_repeats=random.choice([2, 3, 4]), min_span=random.choice([8, 20]))
        answer = hook.for_answer()
        assert answer is not hook
        step = random.randint(5, 70)
        for end in range(10, len(text) + step, step):
            assert answer.check(text[:end], final=False) == hook.check(text[:end], final=False)
        assert answer.check(text, final=True) == hook.check(text, final=True)
        index = answer._index  # type: ignore[attr-defined]
        starts = sorted(at for positions in index.starts.values() for at in positions)
        assert starts == list(range(len(text) - hook.min_span + 1))
    rewritten = GOOD + LOOP  # a mask or cut: the text is not the last one grown
    answer = RepetitionHook(max_repeats=2).for_answer()
    answer.check("Something else entirely, and long enough.", final=False)
    assert answer.check(rewritten, final=False) == RepetitionHook(max_repeats=2).check(
        rewritten, final=False
    )


@pytest.mark.unit
def test_an_answers_sentence_counts_are_kept_between_checks_and_match_a_fresh_count():
    """Repeated lines and sentences are counted as they complete (each check splits only the
    text after the last complete one), and every check says what a fresh hook says of the
    same prefix: separators split across chunks, blank lines, a rewritten text."""
    import random

    random.seed(11)
    sentences = [
        "The lighthouse keeper counted every ship",
        "He wrote each name down in a book",
        "Nobody ever read the book he kept",
        "Then the storm came in from the west",
        "3.14 is not where a sentence ends",
    ]
    separators = [". ", ".\n", "!\n\n", "? ", "\n", ". \n ", ".  "]
    for _trial in range(150):
        parts = []
        for _ in range(random.randint(3, 14)):
            parts.append(random.choice(sentences[: random.randint(2, 5)]))
            parts.append(random.choice(separators))
        text = "".join(parts)
        hook = RepetitionHook(max_repeats=random.choice([2, 3, 4]), min_span=random.choice([8, 20]))
        answer = hook.for_answer()
        step = random.randint(1, 40)
        for end in range(1, len(text) + step, step):
            assert answer.check(text[:end], final=False) == hook.check(text[:end], final=False)
        assert answer.check(text, final=True) == hook.check(text, final=True)
    answer = RepetitionHook(max_repeats=2, min_span=8).for_answer()
    answer.check("One line here.\nOne line here.\n", final=False)
    rewritten = "Another start.\nOne line here.\nOne line here.\n"  # not the text grown
    assert answer.check(rewritten, final=False) == RepetitionHook(max_repeats=2, min_span=8).check(
        rewritten, final=False
    )
    assert answer._segments.text == rewritten  # type: ignore[attr-defined]
    assert answer._segments.complete == len(rewritten)  # type: ignore[attr-defined]
