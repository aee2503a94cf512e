"""An answer's identity names the engine row that made it (chat/turns/identity.py): a cached
answer or a shared generation never crosses engines, and what decides nothing about the answer
(the name users see, its cost weight, its limits) does not split it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.engine.remote.capabilities import Capabilities
from chat.engine.types import GenerationRequest
from chat.infra.engines import EngineSpec
from chat.turns.identity import answer_identity
from harness.examples import fuzz_examples
from tests.test_answer_identity import (
    BASE_IDS,
    BASE_PARAMS,
    BASE_POLICY,
    MESSAGES,
    ONE_CHANGE,
    Machine,
    changed_case,
)

REMOTE = EngineSpec(
    id=1,
    name="Peer",
    slug="peer",
    kind="remote",
    api_root="http://10.0.0.5:8000/v1",
    served_model="smollm2",
)
# One identity field of the engine changed at a time.
ENGINE_CHANGES = {
    "id": 2,  # another row on the same server: its own answers
    "kind": "local",
    "api_root": "http://10.0.0.6:8000/v1",
    "served_model": "smollm2-instruct",
}


class Server(Machine):
    """A remote-like backend: what the server was found to refuse is part of what it answers."""

    def __init__(self, refused: tuple[str, ...] = ()):
        super().__init__()
        self.capabilities = Capabilities()
        self.capabilities.refused.update(refused)


def identity(engine: EngineSpec | None = REMOTE, backend=None, **case) -> str | None:
    request = GenerationRequest(
        input_ids=list(case.get("ids", BASE_IDS)),
        params=case.get("params", BASE_PARAMS),
        messages=case.get("messages") or list(MESSAGES),
    )
    backend = backend or case.get("backend") or Server()
    if isinstance(backend, Machine) and not isinstance(backend, Server):
        server = Server()
        server.identity = backend.identity  # a model change, on the engine's server
        backend = server
    return answer_identity(
        backend,
        case.get("policy", BASE_POLICY),
        request,
        client_context=False,
        engine=engine,
    )


def engine_case(change: tuple[str, str]) -> dict:
    kind, name = change
    if kind == "engine":
        if name == "default":
            return {"engine": None}
        return {"engine": replace(REMOTE, **{name: ENGINE_CHANGES[name]})}
    if kind == "server":
        return {"backend": Server(refused=("seed",))}
    return changed_case(kind, name)


ANY_CHANGE = st.one_of(
    st.tuples(st.just("engine"), st.sampled_from([*sorted(ENGINE_CHANGES), "default"])),
    st.tuples(st.just("server"), st.just("refused")),
    ONE_CHANGE,
)


@pytest.mark.unit
@settings(max_examples=fuzz_examples(200), deadline=None)
@given(first=ANY_CHANGE, second=ANY_CHANGE)
def test_answers_of_two_engines_never_share_an_identity(first, second):
    """Cases from {base, base with one input changed}, the engine's own fields and what its
    server refuses among the inputs, share an identity only when they are the same case."""
    base = identity()
    one, other = identity(**engine_case(first)), identity(**engine_case(second))
    assert base is not None and one is not None
    assert one != base and other != base
    assert (one == other) == (first == second)


@pytest.mark.unit
@settings(max_examples=fuzz_examples(100), deadline=None)
@given(
    name=st.text(min_size=1, max_size=20),
    slug=st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    weight=st.floats(min_value=0, max_value=100),
    concurrency=st.integers(min_value=1, max_value=64),
    enabled=st.booleans(),
)
def test_what_decides_nothing_about_the_answer_does_not_split_it(
    name, slug, weight, concurrency, enabled
):
    """An engine renamed, re-weighted, re-limited or turned off and on answers as before: its
    cached answers stay its own."""
    renamed = replace(
        REMOTE,
        name=name,
        slug=slug,
        cost_weight=weight,
        max_concurrency=concurrency,
        enabled=enabled,
    )
    assert identity(renamed) == identity()
