"""An answer's identity: two requests that differ in any one input never share an answer, and
only reproducible answers from a context the server holds have one (chat/turns/identity.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.engine.sampling_params import SamplingParams, SamplingType
from chat.engine.types import GenerationRequest
from chat.stores.policy_store import ResolvedPolicy
from chat.turns.identity import answer_identity
from harness.examples import fuzz_examples
from harness.scripted import ScriptedBackend

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}
TOOLS = {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}


class Machine(ScriptedBackend):
    """A scripted backend whose weights, kernels and tokenizer can be told apart."""

    def __init__(self, **identity: str):
        super().__init__([])
        self.identity = {
            "weights": "w",
            "mode": "BlockQuantLinear:q4_1",
            "dtype": "torch.float32",
            "device": "cpu",
            "kernels": "avx2",
            "step": "fused",
            "tokenizer": "t",
            **identity,
        }

    def model_identity(self) -> dict[str, str]:
        return self.identity


BASE_POLICY = ResolvedPolicy(
    id=1,
    slug="chat",
    version=1,
    mode="stream",
    system_prompt="Be brief.",
    cache_enabled=True,
    snapshot={"blocklist_terms": ""},
)
# A seeded sample: every sampling parameter then decides something.
BASE_PARAMS = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, seed=7)
MESSAGES = [{"role": "user", "content": "Hi"}]
BASE_IDS = [1, 2, 3, 4]

# One input changed at a time: (what, a function of the base case's parts -> changed parts).
PARAM_CHANGES = {
    "max_new_tokens": 65,
    "temperature": 0.8,
    "top_p": 0.95,
    "seed": 8,
    "repetition_penalty": 1.1,
    "no_repeat_ngram_size": 3,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "stop_strings": ("\nUser:",),
    "eos_token_ids": (99,),
    "min_new_tokens": 2,
    "json_schema": SCHEMA,
    "tool_grammar": TOOLS,
}
MODEL_CHANGES = ("weights", "mode", "dtype", "device", "kernels", "step", "tokenizer")
POLICY_CHANGES = {
    "id": 2,
    "slug": "other",
    "mode": "buffer",
    "system_prompt": "Be long.",
    "schema": SCHEMA,
    "examples": (("Q", "A"),),
    "holdback_chars": 80,
    "max_retries": 2,
    "snapshot": {"blocklist_terms": "spam"},  # a hook's settings live in the stored row
    "overrides": {"stop_strings": ["."]},
}


def identity(backend=None, policy=BASE_POLICY, params=BASE_PARAMS, ids=BASE_IDS, messages=None):
    request = GenerationRequest(
        input_ids=list(ids), params=params, messages=messages or list(MESSAGES)
    )
    return answer_identity(backend or Machine(), policy, request, client_context=False)


def changed_case(kind: str, name: str) -> dict:
    """The base case with exactly one input changed."""
    if kind == "param":
        return {"params": BASE_PARAMS.with_changes(**{name: PARAM_CHANGES[name]})}
    if kind == "model":
        return {"backend": Machine(**{name: "other"})}
    if kind == "policy":
        return {"policy": replace(BASE_POLICY, **{name: POLICY_CHANGES[name]})}
    if name == "input_ids":  # the same words with other ids: typed markers, another template
        return {"ids": [*BASE_IDS[:-1], 5]}
    return {"messages": [{"role": "user", "content": "Hi!"}]}


ONE_CHANGE = st.one_of(
    st.tuples(st.just("param"), st.sampled_from(sorted(PARAM_CHANGES))),
    st.tuples(st.just("model"), st.sampled_from(MODEL_CHANGES)),
    st.tuples(st.just("policy"), st.sampled_from(sorted(POLICY_CHANGES))),
    st.tuples(st.just("input"), st.sampled_from(["input_ids", "messages"])),
)


@pytest.mark.unit
@settings(max_examples=fuzz_examples(200), deadline=None)
@given(first=ONE_CHANGE, second=ONE_CHANGE)
def test_two_requests_that_differ_in_one_input_never_share_an_identity(first, second):
    """Any two cases from {base, base with one input changed} share an identity only when they
    are the same case: model input, weights mode, policy settings and every sampling parameter."""
    base = identity()
    one, other = identity(**changed_case(*first)), identity(**changed_case(*second))
    assert base is not None and one is not None
    assert one != base and other != base
    assert (one == other) == (first == second)


@pytest.mark.unit
def test_the_identity_is_stable_and_ignores_what_decides_nothing():
    """The same inputs hash alike in another order, and a greedy answer's seed and top_p (never
    read without sampling) do not split it."""
    assert identity() == identity(params=SamplingParams(**vars(BASE_PARAMS)))
    greedy = SamplingParams(max_new_tokens=64)
    assert greedy.sampling_type is SamplingType.GREEDY
    assert identity(params=greedy) == identity(params=greedy.with_changes(seed=3, top_p=0.5))
    # Seeds equal modulo 2**64 start the same generator, so they are the same answer.
    assert identity(params=BASE_PARAMS.with_changes(seed=-1)) == identity(
        params=BASE_PARAMS.with_changes(seed=2**64 - 1)
    )


@pytest.mark.unit
def test_a_sample_without_a_seed_and_a_context_only_the_client_holds_have_no_identity():
    """Never shared: a sampled answer with no seed (the first sample would win for everyone), and
    an answer whose history or instructions the server does not hold."""
    sampled = BASE_PARAMS.with_changes(seed=None)
    assert sampled.sampling_type is SamplingType.RANDOM and not sampled.reproducible
    assert identity(params=sampled) is None
    request = GenerationRequest(input_ids=BASE_IDS, params=BASE_PARAMS, messages=MESSAGES)
    assert answer_identity(Machine(), BASE_POLICY, request, client_context=True) is None
    assert answer_identity(Machine(), BASE_POLICY, request, client_context=False) is not None


@pytest.mark.unit
def test_a_request_s_context_is_the_client_s_when_it_sends_history_or_a_system_prompt():
    """What /v1 may send: history (tool results among it) and system prompts are the client's;
    a schema, tools or sampling parameters are parameters, which the identity covers."""
    from chat.engine.sampling_params import SamplingChanges
    from chat.stores.policy_store import PolicyOverride
    from chat.turns.prepare import Given

    assert Given(history=[{"role": "user", "content": "a"}]).client_context
    assert Given(override=PolicyOverride(system_prompt="You are a pirate.")).client_context
    assert not Given(history=[]).client_context
    seeded = SamplingChanges(replaced={"seed": 1})
    assert not Given(override=PolicyOverride(schema=SCHEMA), sampling=seeded).client_context


@pytest.mark.unit
def test_sampling_parameters_are_checked_in_one_place():
    """The policy form and /v1 read the same ranges from SamplingParams."""
    errors = SamplingParams(temperature=3, top_p=0, max_new_tokens=0, seed=1.5).errors()
    assert set(errors) == {"temperature", "top_p", "max_new_tokens", "seed"}
    assert SamplingParams(temperature=2, top_p=1, seed=-(2**70)).errors() == {}
