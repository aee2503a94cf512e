"""Penalties against loops: their arithmetic, per row in a running batch of the real model, as
policy settings staff validate, in the cache key, and as the fields OpenAI clients send."""

from __future__ import annotations

from dataclasses import replace
from threading import Event

import pytest
import torch
from asgiref.sync import sync_to_async
from transformers import RepetitionPenaltyLogitsProcessor

from chat.engine.local.penalties import AnswerOnly, FrequencyPresencePenalty, penalty_processors
from chat.engine.sampling_params import SamplingParams, penalty_errors
from chat.engine.types import GenerationRequest
from chat.models import OutputPolicy
from chat.stores.policy_store import builtin_policy, policy_errors
from chat.turns.identity import answer_identity
from harness.scripted import Answer, ScriptedBackend
from tests.test_openai_views import alice, ask, assert_openai_error, post  # noqa: F401


@pytest.mark.unit
def test_frequency_and_presence_penalties_follow_openais_definition():
    """logit -= frequency * count + presence * (count > 0), over the ids given, per row."""
    scores = torch.zeros(2, 5)
    answer = torch.tensor([[1, 1, 3], [4, 4, 4]])
    out = FrequencyPresencePenalty(0.5, 0.25)(answer, scores.clone())
    assert out[0].tolist() == [0.0, -1.25, 0.0, -0.75, 0.0]
    assert out[1].tolist() == [0.0, 0.0, 0.0, 0.0, -1.75]
    untouched = torch.randn(1, 5)
    assert torch.equal(
        FrequencyPresencePenalty(1.0, 1.0)(torch.empty(1, 0, dtype=torch.long), untouched.clone()),
        untouched,
    )


@pytest.mark.unit
def test_penalties_read_the_answer_not_the_prompt():
    """A token only the prompt holds (the template's end-of-turn, say) keeps its logit."""
    prompt_only, generated = 2, 7
    ids = torch.tensor([[5, prompt_only, 6, generated]])  # 3 prompt ids, then the answer
    scores = torch.full((1, 10), 2.0)
    out = AnswerOnly(RepetitionPenaltyLogitsProcessor(2.0), prompt_length=3)(ids, scores)
    assert out[0, prompt_only] == 2.0 and out[0, generated] == 1.0
    assert out[0, 5] == 2.0


@pytest.mark.unit
def test_neutral_penalties_add_no_processor_and_ranges_are_checked():
    """Off means no work per step; out-of-range values are named with their range."""
    assert penalty_processors(SamplingParams(), prompt_length=4) == []
    params = SamplingParams(repetition_penalty=1.1, no_repeat_ngram_size=3)
    assert len(penalty_processors(params, prompt_length=4)) == 2
    assert (
        penalty_errors(repetition_penalty=1.1, frequency_penalty=-2, no_repeat_ngram_size=0) == {}
    )
    errors = penalty_errors(
        repetition_penalty=0, presence_penalty=2.5, frequency_penalty=True, no_repeat_ngram_size=1
    )
    assert set(errors) == {
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "no_repeat_ngram_size",
    }
    assert "0.5 to 2.0" in errors["repetition_penalty"]


def _repeated_ngrams(ids: list[int], n: int) -> int:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) - len(set(grams))


@pytest.mark.integration
def test_rows_with_different_penalties_share_a_batch_of_the_real_model(backend):
    """Each row keeps its own rule: the no-repeat row never repeats a 2-gram of its answer,
    while rows with other settings decode beside it to their full forced length."""
    messages = [{"role": "user", "content": "Repeat the word cat many times."}]
    plain = backend.request(messages, max_new_tokens=40, min_new_tokens=40)

    def varied(**params):
        return replace(plain, params=plain.params.with_changes(**params), cancel=Event())

    no_repeat = varied(no_repeat_ngram_size=2)
    frequency = varied(frequency_penalty=1.5, presence_penalty=0.5)
    repetition = varied(repetition_penalty=1.3)
    requests = [plain, no_repeat, frequency, repetition]
    rows = [backend.row(r, lambda _text: None) for r in requests]
    batch = backend.new_batch()
    batch.add(rows)
    while len(batch):
        batch.step()
    assert [len(row.new_ids) for row in rows] == [40, 40, 40, 40]
    assert _repeated_ngrams(rows[1].new_ids, 2) == 0
    # min_new_tokens for all; each penalised row adds its own rule and nothing else's.
    assert [len(row.processors) for row in rows] == [1, 2, 2, 2]


@pytest.mark.unit
def test_staff_see_out_of_range_penalties_before_saving(db):
    """The admin's validation names each bad penalty; sensible ones pass."""
    policy = OutputPolicy(
        name="p", slug="p", repetition_penalty=3, no_repeat_ngram_size=1, presence_penalty=-3
    )
    errors = policy_errors(policy)
    assert {"repetition_penalty", "no_repeat_ngram_size", "presence_penalty"} <= set(errors)
    fine = OutputPolicy(name="q", slug="q", repetition_penalty=1.1, no_repeat_ngram_size=4)
    assert not {"repetition_penalty", "no_repeat_ngram_size"} & set(policy_errors(fine))


@pytest.mark.unit
def test_penalties_are_part_of_the_answer_identity():
    """A changed penalty never serves an answer made without it; a neutral one changes nothing."""
    backend = ScriptedBackend([])
    policy = builtin_policy()
    base = GenerationRequest.of([1, 2], max_new_tokens=8)

    def identity(request):
        return answer_identity(backend, policy, request, client_context=False)

    key = identity(base)
    assert key == identity(replace(base, params=base.params.with_changes(repetition_penalty=1.0)))
    changed = {
        identity(replace(base, params=base.params.with_changes(**{name: value})))
        for name, value in (
            ("repetition_penalty", 1.1),
            ("no_repeat_ngram_size", 3),
            ("frequency_penalty", 0.5),
            ("presence_penalty", 0.5),
        )
    }
    assert key not in changed and len(changed) == 4


@pytest.mark.unit
@pytest.mark.django_db(transaction=True)
async def test_openai_clients_penalties_reach_the_engine_and_bad_ones_are_refused(
    scripted,
    alice,  # noqa: F811
):
    """frequency_penalty and presence_penalty (OpenAI's) and repetition_penalty (vLLM's) are
    honoured per request; out of range is a 400 naming the parameter."""
    backend = scripted(Answer(("ok",)))
    fields = {"frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.2}
    response, body = await post(alice[1], ask("Hi", **fields))
    assert response.status_code == 200, body
    request = backend.requests[0]
    params = request.params
    assert (params.frequency_penalty, params.presence_penalty, params.repetition_penalty) == (
        0.5,
        -0.5,
        1.2,
    )
    for name, value in (
        ("frequency_penalty", 2.5),
        ("repetition_penalty", "1"),
        ("presence_penalty", True),
    ):
        response, body = await post(alice[1], ask("Hi", **{name: value}))
        assert assert_openai_error(response, body, 400)["param"] == name
    assert len(backend.requests) == 1  # refused before any generation


@pytest.mark.unit
@pytest.mark.django_db(transaction=True)
async def test_a_policys_penalties_reach_every_turn(scripted, make_policy):
    """Staff set them once per policy; each request under it carries them."""
    from project.asgi import application
    from tests.conftest import ChatClient

    await sync_to_async(make_policy)(
        slug="tidy", repetition_penalty=1.15, no_repeat_ngram_size=4, frequency_penalty=0.1
    )
    backend = scripted(Answer(("Fine.",)))
    chat = await ChatClient(application).connect()
    try:
        request_id = await chat.prompt("Hello", policy="tidy")
        await chat.receive_until("done", request_id, timeout=10)
    finally:
        await chat.close()
    params = backend.requests[0].params
    assert (
        params.repetition_penalty,
        params.no_repeat_ngram_size,
        params.frequency_penalty,
    ) == (
        1.15,
        4,
        0.1,
    )
