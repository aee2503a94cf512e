"""What the upstream accepts, found rather than assumed: against the scripted fake server's
refusals, 500s and leaks (the real engine's side is in test_real_engine.py)."""

from __future__ import annotations

import logging

import pytest

from chat.engine.remote.capabilities import discover
from chat.engine.remote.openai_backend import OpenAIBackend, RemoteConfig
from chat.engine.types import EngineError
from harness.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.integration

COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
# What `transformers serve --continuous-batching` does (measured): its model list fails, it
# refuses vLLM's extensions with a 422 and streams straight through `stop` and `response_format`.
LIKE_TRANSFORMERS_SERVE = dict(
    models_status=500,
    refuse_fields=frozenset({"stop_token_ids", "min_tokens"}),
    leak_stop_strings=True,
)


@pytest.fixture
def serve(backend):
    made = []

    def start(**options) -> FakeOpenAIServer:
        server = FakeOpenAIServer(backend, **options).start()
        made.append(server)
        return server

    yield start
    for server in made:
        server.stop()


def remote_for(server, backend) -> OpenAIBackend:
    return OpenAIBackend(
        RemoteConfig(
            base_url=server.url,
            model=server.model,
            timeout=120,
            context_length=backend.context_length,
        ),
        tokenizer=backend.tokenizer,
    )


def test_a_field_refused_with_422_is_dropped_the_request_sent_once_more_and_never_again(
    serve, backend
):
    fake = serve(refuse_fields=frozenset({"stop_token_ids", "min_tokens"}))
    remote = remote_for(fake, backend)
    request = remote.request(COUNT, max_new_tokens=12, eos_token_ids=(2,), min_new_tokens=1)
    first = remote.generate(request)
    assert first.finish_reason in {"eos", "length"} and first.text.strip()
    assert len(fake.refused) == 1 and {"stop_token_ids", "min_tokens"} <= set(fake.refused[0])
    assert not {"stop_token_ids", "min_tokens"} & set(fake.served[-1].body)
    assert remote.capabilities.refused == {"stop_token_ids", "min_tokens"}

    remote.generate(remote.request(COUNT, max_new_tokens=4, eos_token_ids=(2,), min_new_tokens=1))
    assert len(fake.refused) == 1  # learned: the next request went through at once
    assert fake.posts == 3


def test_a_refusal_that_names_no_optional_field_and_a_500_are_not_retried(serve, backend):
    fake = serve()
    remote = remote_for(fake, backend)
    fake.fail_with = 500
    with pytest.raises(EngineError, match="HTTP 500"):
        remote.generate(remote.request(COUNT, max_new_tokens=4))
    fake.fail_with = 422  # names nothing we could leave out
    with pytest.raises(EngineError, match="HTTP 422"):
        remote.generate(remote.request(COUNT, max_new_tokens=4, stop_strings=("x",)))
    assert fake.posts == 2 and remote.capabilities.refused == set()


def test_discovery_finds_what_a_server_like_transformers_serve_accepts_and_logs_it_once(
    serve, backend, caplog
):
    fake = serve(**LIKE_TRANSFORMERS_SERVE)
    remote = remote_for(fake, backend)
    lines: list[str] = []
    with caplog.at_level(logging.INFO, logger="chat.engine.remote.capabilities"):
        caps = discover(remote, progress=lines.append)
    assert caps.models == "HTTP 500"
    assert caps.refused == {"stop_token_ids", "min_tokens"}
    assert caps.stop == "ignored" and caps.schema == "ignored" and not caps.enforces_schema
    assert len(lines) == 1 and "stop ignored" in lines[0] and "HTTP 500" in lines[0]
    assert caplog.records == []  # found at start-up: said in that one line only

    # Later findings are logged, once each.
    with caplog.at_level(logging.INFO, logger="chat.engine.remote.capabilities"):
        caps.saw(stop="honoured")
        caps.saw(stop="honoured")
    assert [r.getMessage() for r in caplog.records] == ["upstream stop: honoured"]


def test_discovery_asks_again_while_a_server_names_one_refused_field_at_a_time(serve, backend):
    fake = serve(
        refuse_fields=frozenset({"stop_token_ids", "min_tokens"}), one_refusal_at_a_time=True
    )
    caps = discover(remote_for(fake, backend), progress=lambda line: None)
    assert caps.refused == {"stop_token_ids", "min_tokens"} and len(fake.refused) == 2
    assert caps.stop == "honoured"  # discovery went on past the refusals


def test_discovery_against_a_server_that_honours_stop(serve, backend):
    fake = serve()
    caps = discover(remote_for(fake, backend), progress=lambda line: None)
    assert caps.models == "ok" and caps.refused == set()
    assert caps.stop == "honoured"
    assert caps.schema == "ignored"  # the fake never constrains: the gate here validates


def test_an_unreachable_server_leaves_everything_unknown_and_does_not_fail(backend):
    from harness.liveserver import free_port

    remote = OpenAIBackend(
        RemoteConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", timeout=5),
        tokenizer=backend.tokenizer,
    )
    lines: list[str] = []
    caps = discover(remote, progress=lines.append)
    assert (caps.stop, caps.schema, caps.chat) == ("unknown", "unknown", "unreachable")
    assert len(lines) == 1 and "not asked at start-up" in lines[0]


def test_a_failing_model_list_beside_a_working_chat_endpoint_is_not_an_outage(serve, backend):
    fake = serve(models_status=500)
    remote = remote_for(fake, backend)
    assert remote.probe().startswith("unavailable: HTTP 500")  # nothing answered yet
    remote.generate(remote.request(COUNT, max_new_tokens=4))
    assert remote.probe() == "ok"
    fake.fail_with = 500  # now the chat endpoint fails too
    with pytest.raises(EngineError):
        remote.generate(remote.request(COUNT, max_new_tokens=4))
    assert remote.probe().startswith("unavailable: HTTP 500")


@pytest.mark.django_db
def test_healthz_is_ok_not_degraded_with_a_failing_model_list_and_names_the_capabilities(
    serve, backend, settings, monkeypatch
):
    from chat.health.readiness import health
    from chat.infra.runtime import runtime

    fake = serve(**LIKE_TRANSFORMERS_SERVE)
    remote = remote_for(fake, backend)
    discover(remote, progress=lambda line: None)
    settings.CHAT_BACKEND, settings.CHAT_REMOTE_URL = "openai", fake.url
    monkeypatch.setattr(runtime, "backend", remote)
    monkeypatch.setattr(runtime, "state", "ready")
    ready, report = health()
    assert ready and report["upstream_status"] == "ok" and report["status"] == "ok"
    assert "models endpoint HTTP 500" in report["upstream_capabilities"]
