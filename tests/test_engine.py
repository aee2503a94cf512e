"""The engine on the real model, from plain Python: streaming, stopping, finish reasons."""

import threading

import pytest

from chat.engine.local.stopping import CancelledCriteria
from chat.engine.text.holdback import StopStringHoldback
from chat.engine.types import PromptTooLong

COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]


@pytest.mark.integration
def test_chunks_concatenate_to_the_result_text(backend):
    """What the streamer hands out, joined, is exactly the stored text; eos ends it."""
    chunks = []
    result = backend.generate(backend.request(COUNT, max_new_tokens=40), chunks.append)
    assert len(chunks) > 1
    assert "".join(chunks) == result.text
    assert result.text.strip()
    assert result.finish_reason in ("eos", "length")
    assert result.first_token_at is not None and result.new_tokens > 5


@pytest.fixture(scope="module")
def count_answer(backend) -> str:
    """The greedy answer to COUNT, generated once for the tests that cut it somewhere."""
    return backend.generate(backend.request(COUNT, max_new_tokens=60)).text


@pytest.mark.integration
def test_stop_string_ends_with_stop_string_and_is_never_shown(backend, count_answer):
    """A stop string cuts the answer; neither it nor a prefix of it reaches the user."""
    plain = count_answer
    # A stop string taken from the greedy answer itself, so no wording is assumed.
    middle = len(plain) // 2
    stop = plain[middle : middle + 3]
    assert len(plain) > 6 and stop.strip(), plain
    chunks = []
    result = backend.generate(
        backend.request(COUNT, max_new_tokens=60, stop_strings=(stop,)), chunks.append
    )
    assert result.finish_reason == "stop_string"
    assert result.text == plain[: plain.index(stop)]
    assert "".join(chunks) == result.text  # so no prefix of the stop string was shown either


@pytest.mark.integration
def test_extra_eos_id_ends_with_eos(backend, count_answer):
    """An extra end-of-sequence id from a list stops generation where that token appears."""
    comma = backend.token_id(",")
    plain = count_answer
    assert "," in plain, plain  # the prompt asks for a comma-separated list
    result = backend.generate(backend.request(COUNT, max_new_tokens=60, eos_token_ids=(comma,)))
    assert result.finish_reason == "eos"
    # It ends on its first comma token: the greedy answer up to there, and no earlier comma.
    assert result.text.endswith(",") and "," not in result.text[:-1]
    assert plain.startswith(result.text)


@pytest.mark.integration
def test_max_new_tokens_ends_with_length(backend):
    """An answer cut by max_new_tokens says so, with exactly that many tokens."""
    result = backend.generate(backend.request(COUNT, max_new_tokens=4))
    assert result.finish_reason == "length"
    assert result.new_tokens == 4


@pytest.mark.integration
def test_max_new_tokens_is_capped_by_the_server(backend, monkeypatch):
    """No request can ask for more than the configured ceiling."""
    monkeypatch.setattr(
        backend,
        "config",
        backend.config.__class__(**{**backend.config.__dict__, "max_new_tokens_cap": 3}),
    )
    result = backend.generate(backend.request(COUNT, max_new_tokens=500))
    assert (result.finish_reason, result.new_tokens) == ("length", 3)


@pytest.mark.integration
def test_cancel_mid_stream_stops_within_one_step(backend):
    """Setting the cancel flag as the first chunk arrives stops after at most one more token."""
    request = backend.request(
        [{"role": "user", "content": "Write a long story about a dragon."}], max_new_tokens=200
    )
    seen = []

    def on_text(text):
        seen.append(text)
        request.cancel.set()

    result = backend.generate(request, on_text)
    assert result.finish_reason == "cancelled"
    assert result.new_tokens <= backend.token_count(seen[0]) + 2
    assert "".join(seen) == result.text


@pytest.mark.integration
def test_cancel_from_another_thread_stops_generation(backend):
    """A cancel from another thread (the event loop's) ends a long answer early."""
    request = backend.request(
        [{"role": "user", "content": "Write a long story about a dragon."}], max_new_tokens=300
    )
    first = threading.Event()
    threading.Thread(target=lambda: (first.wait(60), request.cancel.set())).start()
    result = backend.generate(request, lambda _text: first.set())
    assert result.finish_reason == "cancelled"
    assert result.new_tokens < 300


@pytest.mark.integration
def test_prompt_longer_than_the_context_is_refused(backend):
    """A prompt that leaves no room for the answer is an error, not a truncated answer."""
    with pytest.raises(PromptTooLong, match="context of 8192 tokens"):
        backend.generate(
            backend.request([{"role": "user", "content": "word " * 9000}], max_new_tokens=10)
        )


@pytest.mark.unit
def test_cancelled_criteria_reports_the_flag_per_row():
    """The criterion is False until the flag is set, then True for every row."""
    import torch

    flag = threading.Event()
    criteria = CancelledCriteria(flag)
    ids = torch.zeros((2, 3), dtype=torch.long)
    assert criteria(ids, None).tolist() == [False, False]
    flag.set()
    assert criteria(ids, None).tolist() == [True, True]
    per_row = CancelledCriteria([threading.Event(), flag])
    assert per_row(ids, None).tolist() == [False, True]


@pytest.mark.unit
@pytest.mark.parametrize(
    "pieces", [["Hello\nUser: hi"], list("Hello\nUser: hi"), ["Hel", "lo\nUs", "er: hi"]]
)
def test_stop_string_holdback_is_independent_of_chunk_boundaries(pieces):
    """However the text is split, the visible text is the same and never shows a partial marker."""
    holdback = StopStringHoldback(["\nUser:"])
    visible = [holdback.feed(p) for p in pieces]
    assert "".join(visible) + holdback.finish() == "Hello"
    assert all("\n" not in v for v in visible)


@pytest.mark.unit
def test_stop_string_holdback_releases_a_false_alarm():
    """A held-back prefix that never completes is shown at the end."""
    holdback = StopStringHoldback(["\nUser:"])
    assert holdback.feed("a\nUs") == "a"
    assert holdback.feed("e") == ""  # "\nUse" could still become "\nUser:"
    assert holdback.feed("!") == "\nUse!"
    assert holdback.feed("\n") == ""
    assert holdback.finish() == "\n"


@pytest.mark.integration
def test_a_batch_applies_every_stopping_rule_per_row(backend):
    """In one batch, each row ends by its own rule: stop string, extra eos, length, cancel, and
    the last one by eos or length (whether greedy wording ends on eos depends on CPU and dtype)."""
    stop = backend.request(COUNT, max_new_tokens=60, stop_strings=(", 5",))
    comma = backend.request(COUNT, max_new_tokens=60, eos_token_ids=(backend.token_id(","),))
    short = backend.request(COUNT, max_new_tokens=4)
    story = backend.request(
        [{"role": "user", "content": "Write a long story about a dragon."}], max_new_tokens=120
    )
    plain = backend.request([{"role": "user", "content": "Say hello."}], max_new_tokens=60)
    chunks = [[] for _ in range(5)]

    def on_story(text):
        chunks[3].append(text)
        story.cancel.set()

    callbacks = [chunks[0].append, chunks[1].append, chunks[2].append, on_story, chunks[4].append]
    results = backend.generate_batch([stop, comma, short, story, plain], callbacks)
    assert [r.finish_reason for r in results[:4]] == ["stop_string", "eos", "length", "cancelled"]
    assert results[4].finish_reason in ("eos", "length")
    for result, pieces in zip(results, chunks, strict=True):
        assert "".join(pieces) == result.text
    assert ", 5" not in results[0].text and results[0].text.strip()
    assert results[1].text.endswith(",") and results[1].new_tokens <= 3
    assert results[2].new_tokens == 4
    assert results[3].new_tokens <= backend.token_count(chunks[3][0]) + 2
    assert results[4].text and results[4].new_tokens <= 60


@pytest.fixture
def joins(backend):
    """How many rows each add() to the real backend's running batches prefilled together."""
    counts = []
    original = backend.new_batch

    def recording():
        batch = original()
        add = batch.add
        batch.add = lambda rows: (rows and counts.append(len(rows)), add(rows))[1]
        return batch

    backend.new_batch = recording
    yield counts
    del backend.new_batch


@pytest.mark.integration
def test_requests_queued_while_the_model_is_busy_join_the_running_batch(backend, joins):
    """Requests submitted mid-answer start at once (position 0), joined into the running batch,
    each still streamed and ended on its own."""
    import threading as _threading

    from chat.engine.local.scheduler import ContinuousScheduler
    from chat.engine.types import Finished, Started, TextChunk

    scheduler = ContinuousScheduler(backend, max_batch=4)
    events = {name: [] for name in "abcd"}
    done = {name: _threading.Event() for name in "abcd"}
    chunk = _threading.Event()

    def sink_for(name):
        def sink(event):
            events[name].append(event)
            if isinstance(event, TextChunk):
                chunk.set()
            if isinstance(event, Finished):
                done[name].set()

        return sink

    try:
        scheduler.submit(
            backend.request(COUNT, max_new_tokens=30, min_new_tokens=30), sink_for("a")
        )
        assert chunk.wait(60)  # the model is busy with "a" before the others arrive
        positions = [
            scheduler.submit(backend.request(COUNT, max_new_tokens=8), sink_for(n))[1]
            for n in "bcd"
        ]
        assert all(done[n].wait(120) for n in "abcd")
    finally:
        scheduler.close()
    assert positions == [0, 0, 0]
    assert joins[0] == 1 and sum(joins) == 4 and len(joins) <= 4
    for name in "bcd":
        kinds = [type(e) for e in events[name]]
        assert kinds[-1] is Finished and Started in kinds and TextChunk in kinds
        result = events[name][-1].result
        assert "".join(e.text for e in events[name] if isinstance(e, TextChunk)) == result.text
        assert result.finish_reason == "length" and result.new_tokens == 8
    assert events["a"][-1].result.new_tokens == 30


@pytest.mark.integration
def test_requests_announced_together_start_in_one_batch(backend, joins):
    """An idle worker holds the first step for requests still being prepared, then prefills them together."""
    import threading as _threading
    import time as _time

    from chat.engine.local.scheduler import ContinuousScheduler
    from chat.engine.types import Finished

    scheduler = ContinuousScheduler(backend, max_batch=4)
    finished = _threading.Semaphore(0)
    sink = lambda event: isinstance(event, Finished) and finished.release()  # noqa: E731
    try:
        scheduler.expect()
        scheduler.expect()
        scheduler.submit(backend.request(COUNT, max_new_tokens=3), sink, expected=True)
        _time.sleep(0.05)  # the second user's prompt is still being prepared
        scheduler.submit(backend.request(COUNT, max_new_tokens=3), sink, expected=True)
        assert finished.acquire(timeout=60) and finished.acquire(timeout=60)
    finally:
        scheduler.close()
    assert joins == [2]
