"""Engine rows around the answers: a remote engine's key only ever named from the operator's
allow-list, /healthz's line per engine (ok or unavailable, why only in the log), and the latency
page's split by engine. No model: the runtime's slots are set by hand."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from chat.health.readiness import health, public
from chat.infra import behaviour, latency
from chat.infra.engines import EngineSpec
from chat.infra.runtime import runtime
from chat.models import Conversation, Engine
from tests.test_latency_page import store

pytestmark = [pytest.mark.unit, pytest.mark.django_db]


def remote(**fields) -> Engine:
    return Engine(
        name="Big server",
        slug="big",
        kind=Engine.Kind.REMOTE,
        api_root="http://10.0.0.5:8000/v1",
        served_model="qwen",
        **fields,
    )


def test_a_remote_engines_key_is_named_from_the_allow_list_and_shown_only_as_set(settings):
    """Only a variable CHAT_HOOKS secrets= lists may be named; the row holds the name, and
    whether it holds a key is all anyone is shown."""
    settings.CHAT_HOOK_SECRETS = {"VLLM_KEY": "sk-secret", "UNSET_KEY": ""}
    with pytest.raises(ValidationError) as refused:
        remote(api_key_variable="SECRET_KEY").full_clean()
    assert "api_key_variable" in refused.value.message_dict
    named = remote(api_key_variable="VLLM_KEY")
    named.full_clean()
    assert named.api_key_set and not remote(api_key_variable="UNSET_KEY").api_key_set
    with pytest.raises(ValidationError):
        Engine(name="Half", slug="half", kind=Engine.Kind.REMOTE).full_clean()  # no root, model


def test_healthz_counts_engines_for_anyone_and_names_them_for_staff(admin_client):
    """An engine refused after a failure makes the process degraded, not down. Anyone is told
    how many engines are ok and unavailable, with no slug, URL or error; staff see each engine
    by slug with why it is down."""
    spec = EngineSpec.of(remote(id=41))
    why = "unavailable: refused the connection at http://10.0.0.5:8000/v1"
    try:
        runtime.engines.failed(spec, "refused the connection at http://10.0.0.5:8000/v1")
        _, report = health()
        assert report["engines"] == {"big": why}
        shown = public(report)
        assert shown["engines"] == {"ok": 0, "unavailable": 1}
        assert "10.0.0.5" not in str(shown) and "big" not in str(shown)
        anonymous = Client().get("/healthz").json()
        assert anonymous["engines"] == {"ok": 0, "unavailable": 1}
        assert "big" not in str(anonymous)
        assert admin_client.get("/healthz").json()["engines"] == {"big": why}
    finally:
        runtime.engines.close()


def test_the_latency_and_behaviour_pages_split_answers_by_engine(admin_client):
    """?engine= keeps one engine's answers, by the name their metrics carry."""
    conversation = Conversation.objects.create(session_key="s", title="engines")
    for engine, ttft in (("default", 100), ("default", 200), ("Big server", 900)):
        store(conversation, ago=timedelta(minutes=5), ttft_ms=ttft, total_ms=ttft, engine=engine)
    assert latency.latency_report(24).totals.count == 3
    assert latency.latency_report(24, engine="Big server").totals.ttft_p50 == 900
    assert latency.latency_report(24, engine="default").totals.count == 2
    assert behaviour.behaviour_report(24).totals.finished == 3
    assert behaviour.behaviour_report(24, engine="Big server").totals.finished == 1
    remote().save()
    for page in ("latency", "behaviour"):
        html = admin_client.get(f"/admin/{page}/?engine=Big+server").content.decode()
        assert '<option value="Big server" selected>' in html


def test_the_providers_groups_claim_fills_the_groups_engines_are_kept_for():
    """With a groups claim configured, each sign-in sets the user's membership of the groups an
    engine names from the claim; a group no engine names is the admin's and left alone."""
    from django.contrib.auth.models import Group

    from chat.stores.oidc_accounts import account_for

    engine_group, other = Group.objects.create(name="gpu"), Group.objects.create(name="other")
    row = remote()
    row.save()
    row.groups.add(engine_group)
    mapping = {"groups_claim": "groups", "staff_groups": set(), "superuser_groups": set()}
    issuer = "https://id.example"
    user = account_for({"sub": "u1", "groups": ["/gpu"]}, issuer=issuer, mapping=mapping)
    assert set(user.groups.values_list("name", flat=True)) == {"gpu"}
    user.groups.add(other)
    account_for({"sub": "u1", "groups": []}, issuer=issuer, mapping=mapping)
    assert set(user.groups.values_list("name", flat=True)) == {"other"}


def test_a_full_or_down_engine_sends_its_policies_to_the_fallback(monkeypatch):
    """The policy's own engine while it has room; its fallback, marked so, while it is full or
    refused; without a fallback, the engine's own refusal."""
    from types import SimpleNamespace

    from chat.infra.runtime import NotReady

    own, stand_in = EngineSpec.of(remote(id=51)), EngineSpec(52, "Small", "small", "remote")
    queues = {"big": SimpleNamespace(waiting=0, max_waiting=2), "small": SimpleNamespace(waiting=0)}
    monkeypatch.setattr(
        runtime.engines,
        "get",
        lambda spec: (object(), SimpleNamespace(base=queues[spec.slug])),
    )
    assert runtime.serving(own, stand_in).engine == own
    queues["big"].waiting = 2
    chosen = runtime.serving(own, stand_in)
    assert chosen.engine == stand_in and chosen.fallback
    assert runtime.serving(own).engine == own  # no fallback: the queue itself refuses
    monkeypatch.undo()
    try:
        runtime.engines.failed(own, "refused")
        with pytest.raises(NotReady) as refused:
            runtime.serving(own)
        assert refused.value.code == "engine_unavailable"
    finally:
        runtime.engines.close()


def test_a_remote_engine_that_refuses_or_says_nothing_is_refused_at_its_first_prompt():
    """A server that refuses the connection, or accepts it and says nothing, is
    `engine_unavailable` at once (asked for a second at most), never built to fail later."""
    import socket

    from chat.infra.runtime import NotReady

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refusing_port = closed.getsockname()[1]
    closed.close()
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never answers
    try:
        for number, port in enumerate((refusing_port, silent.getsockname()[1])):
            spec = EngineSpec(
                60 + number,
                f"Engine {number}",
                f"e{number}",
                "remote",
                api_root=f"http://127.0.0.1:{port}/v1",
                served_model="m",
            )
            with pytest.raises(NotReady) as refused:
                runtime.serving(spec)
            assert refused.value.code == "engine_unavailable"
            assert runtime.engines.statuses()[spec.slug].startswith("unavailable")
    finally:
        silent.close()
        runtime.engines.close()


def test_an_engine_changed_while_it_answers_keeps_its_old_stack_until_those_end(monkeypatch):
    """Staff change an engine's limits while it answers: the next prompt gets a new stack, the
    running answers keep the old one, which is closed once it is idle."""
    from types import SimpleNamespace

    queue = SimpleNamespace(running=1, waiting=0)
    closed: list[int] = []
    made = iter(range(10))

    def build(slot):
        number = next(made)
        slot.backend = object()
        slot.stack = SimpleNamespace(base=queue, close=lambda: closed.append(number))
        slot.state = "ready"

    monkeypatch.setattr(runtime.engines, "_build_remote", build)
    spec = EngineSpec.of(remote(id=70))
    try:
        _, first = runtime.engines.get(spec)
        changed = EngineSpec.of(remote(id=70, max_concurrency=2))
        _, second = runtime.engines.get(changed)
        assert second is not first and closed == []  # the old one still answers
        queue.running = 0
        runtime.engines.get(changed)
        assert closed == [0]
    finally:
        runtime.engines.close()


def test_renaming_an_engine_keeps_its_usage_and_answers_together(admin_client):
    """Renamed in the admin, an engine's usage rows and its answers' metrics carry the new name:
    the usage, latency and behaviour pages show one history, not two."""
    from django.contrib.auth import get_user_model

    from chat.models import Usage

    engine = remote(cost_weight=2.0)
    engine.save()
    user = get_user_model().objects.create_user("u")
    today = timezone.now().date()
    Usage.objects.create(user=user, policy="json", engine="Big server", day=today, tokens=6)
    # A row already under the new name (an older engine's) takes the counts.
    Usage.objects.create(user=user, policy="json", engine="Big model", day=today, tokens=4)
    conversation = Conversation.objects.create(session_key="s", title="engines")
    store(conversation, ago=timedelta(minutes=5), ttft_ms=900, total_ms=900, engine="Big server")
    data = {
        "name": "Big model",
        "slug": engine.slug,
        "kind": engine.kind,
        "enabled": "on",
        "api_root": engine.api_root,
        "served_model": engine.served_model,
        "timeout_seconds": engine.timeout_seconds,
        "max_concurrency": engine.max_concurrency,
        "context_length": engine.context_length,
        "cost_weight": engine.cost_weight,
    }
    response = admin_client.post(f"/admin/chat/engine/{engine.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    rows = list(Usage.objects.values_list("engine", "tokens"))
    assert rows == [("Big model", 10)]
    assert latency.latency_report(24, engine="Big model").totals.count == 1
    assert latency.latency_report(24, engine="Big server").totals.count == 0


def test_a_policy_falls_back_to_the_default_engine_or_to_another_not_both():
    """The default engine has no row: a policy on another engine names it as its fallback with
    `fallback_to_default`, which its route carries; with a fallback engine too, or on the
    default engine itself, the policy is refused with a reason."""
    from chat.models import OutputPolicy
    from chat.protocol import Prompt
    from chat.stores.engine_routes import route_for
    from chat.stores.policy_store import policy_errors

    engine, other = remote(), Engine(name="Other", slug="other", kind=Engine.Kind.LOCAL)
    engine.save()
    other.save()
    both = OutputPolicy(slug="b", engine=engine, fallback_engine=other, fallback_to_default=True)
    assert "fallback_to_default" in policy_errors(both)
    assert "fallback_to_default" in policy_errors(OutputPolicy(slug="a", fallback_to_default=True))
    policy = OutputPolicy(slug="c", name="c", engine=engine, fallback_to_default=True)
    assert policy_errors(policy) == {}
    policy.save()
    route = route_for(None, Prompt(request_id="r", text="Hi", conversation=None, policy="c"))
    assert route.fallback_default and route.fallback is None
    assert route.engine is not None and route.engine.slug == "big"
