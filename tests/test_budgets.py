"""Token and answer budgets in process: admitted or refused at the socket and /api with the real
model, charged from the tokens generated, counted in real Redis (and without it), set by
`manage.py budget`, the default for new accounts, the usage pages and the counters."""

from __future__ import annotations

import asyncio
import csv
import io
import threading
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.test import AsyncClient, Client
from prometheus_client import REGISTRY

from chat.models import Budget, BudgetDefault, CachedAnswer, Usage
from chat.protocol import event_json
from chat.protocol.events import Error
from chat.stores.apikeys import apikey_create
from chat.stores.budgets import Scope, budget_set, periods, usage_record
from chat.stores.spending import SpendingCounters, counter_key, spending
from chat.turns import TurnError
from chat.turns.budget import budget_charge, budget_check
from harness.liveserver import free_port
from tests.conftest import TEST_CACHE_URL, ChatClient
from tests.test_cache import PROMPT

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
User = get_user_model()


@pytest.fixture(autouse=True)
def counters(settings):
    """The counters on this suite's own Redis database, which conftest empties before each test."""
    settings.REDIS_URL = TEST_CACHE_URL
    backoff = spending.backoff_seconds
    spending.backoff_seconds = 0.0
    spending.clear()
    yield
    spending.backoff_seconds = backoff


def tomorrow_midnight() -> str:
    return f"{datetime.now(UTC).date() + timedelta(days=1)}T00:00:00Z"


async def socket_of(user) -> ChatClient:
    from project.asgi import application

    browser = AsyncClient()
    await browser.aforce_login(user)
    return await ChatClient(application, session_key=browser.cookies["sessionid"].value).connect()


def spent_tokens(user) -> int:
    return sum(Usage.objects.filter(user=user).values_list("tokens", flat=True))


async def test_the_socket_refuses_once_the_daily_tokens_are_spent_and_says_when_they_reset(
    runtime, settings
):
    """Prompts are answered while tokens are left; the answer that crosses the budget is
    finished whole; the next is refused with `quota_exceeded`, what is left and the reset time,
    in words the page shows. The tokens charged are the answers' own."""
    settings.CHAT_MAX_NEW_TOKENS = 6
    user = await sync_to_async(User.objects.create_user)("dora")
    await sync_to_async(budget_set)(user_id=user.pk, api_key_id=None, limits={"daily_tokens": 10})
    chat = await socket_of(user)
    generated = []
    try:
        for n in range(12):
            request_id = await chat.prompt(f"Name a colour, number {n}.")
            event = await chat.receive()
            if event["type"] == "error":
                refusal = event
                break
            events = [event, *await chat.receive_until("done", request_id)]
            generated.append(events[-1]["metrics"]["new_tokens"])
        else:
            raise AssertionError(f"never refused after {generated}")
    finally:
        await chat.close()
    assert generated, refusal
    # Admitted while under the budget, refused at the first prompt past it.
    assert sum(generated[:-1]) < 10 <= sum(generated)
    assert await sync_to_async(spent_tokens)(user) == sum(generated)
    assert refusal["code"] == "quota_exceeded" and refusal["request_id"] == request_id
    assert refusal["left"] == {"daily_tokens": 0} and refusal["resets_at"] == tomorrow_midnight()
    assert refusal["message"] == "your daily budget is spent; it resets at 00:00 UTC"


async def test_a_cache_hit_costs_nothing_and_is_counted_apart(runtime, example_policies):
    """The same prompt twice: the second is served from the cache, charged no tokens and no
    answer, and recorded as a cached answer."""
    user = await sync_to_async(User.objects.create_user)("cached")
    await sync_to_async(budget_set)(user_id=user.pk, api_key_id=None, limits={"daily_answers": 2})
    chat = await socket_of(user)
    try:
        request_id = await chat.prompt(PROMPT)
        first = (await chat.receive_until("done", request_id))[-1]
        assert first["finish_reason"] == "eos"  # cacheable
        for _ in range(400):  # cached just after `done`
            if await sync_to_async(CachedAnswer.objects.exists)():
                break
            await asyncio.sleep(0.05)
        request_id = await chat.prompt(PROMPT)
        done = (await chat.receive_until("done", request_id))[-1]
        assert done["cached"] is True
        # Still one answer of two left: the hit did not count.
        await sync_to_async(budget_check)(user.pk, None)
    finally:
        await chat.close()
    for _ in range(400):  # a hit is recorded just after its `done`
        row = await sync_to_async(Usage.objects.get)(user=user)
        if row.cached_answers:
            break
        await asyncio.sleep(0.05)
    assert (row.answers, row.cached_answers, row.policy) == (1, 1, "chat")
    assert row.tokens > 0 and row.prompt_tokens > 0


async def test_api_answers_429_with_what_is_left_and_the_reset(settings):
    """/api refuses with 429 and the same `error` event as the socket, its new fields included."""
    user = await sync_to_async(User.objects.create_user)("api-user")
    await sync_to_async(budget_set)(
        user_id=user.pk, api_key_id=None, limits={"daily_answers": 1, "monthly_tokens": 500}
    )
    await sync_to_async(usage_record)(
        user_id=user.pk, api_key_id=None, policy="chat", answers=1, tokens=40
    )
    browser = AsyncClient()
    await browser.aforce_login(user)
    response = await browser.post(
        "/api/chat", {"text": "hi", "request_id": "x1"}, content_type="application/json"
    )
    assert response.status_code == 429
    body = response.json()
    assert body["type"] == "error" and body["code"] == "quota_exceeded"
    assert body["left"] == {"daily_answers": 0, "monthly_tokens": 460}
    assert body["resets_at"] == tomorrow_midnight()


def test_a_keys_budget_limits_that_key_and_the_users_limits_every_key():
    """A key's answers count against the key's budget and the user's; the key's budget does not
    limit the user's other ways in."""
    user = User.objects.create_user("keyed")
    key, _ = apikey_create(user=user, name="script")
    other, _ = apikey_create(user=user, name="other")
    budget_set(user_id=user.pk, api_key_id=key.pk, limits={"daily_answers": 1})
    budget_charge(user_id=user.pk, api_key_id=key.pk, policy="chat", tokens=7)
    with pytest.raises(TurnError) as refused:
        budget_check(user.pk, key.pk)
    assert refused.value.message.startswith("this API key's daily budget is spent")
    budget_check(user.pk, other.pk)
    budget_check(user.pk, None)
    budget_set(user_id=user.pk, api_key_id=None, limits={"monthly_tokens": 7})
    with pytest.raises(TurnError) as refused:
        budget_check(user.pk, other.pk)
    first_of_next_month = periods()["month"].resets_at
    assert refused.value.resets_at == first_of_next_month.isoformat().replace("+00:00", "Z")
    assert f"resets on {first_of_next_month:%-d %B} at 00:00 UTC" in refused.value.message


def test_users_without_a_budget_are_never_refused():
    user = User.objects.create_user("free")
    usage_record(user_id=user.pk, api_key_id=None, policy="chat", tokens=10**9, answers=10**6)
    budget_check(user.pk, None)


def test_without_redis_checks_read_the_database_and_missed_charges_are_reconciled(settings):
    """Redis down: a charge is kept in the database, a check sums the database (neither open nor
    closed); Redis back: the counter that missed the charge is dropped and seeded afresh."""
    user = User.objects.create_user("outage")
    budget_set(user_id=user.pk, api_key_id=None, limits={"daily_tokens": 100})
    budget_check(user.pk, None)  # seeds the counters at 0
    day = periods()["day"]
    tokens_key = counter_key(Scope("user", user.pk), day, "tokens")
    reachable = settings.REDIS_URL
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    budget_charge(user_id=user.pk, api_key_id=None, policy="chat", tokens=150)
    assert spent_tokens(user) == 150
    with pytest.raises(TurnError):
        budget_check(user.pk, None)  # from the database
    assert "checked against the database" in spending.status()
    settings.REDIS_URL = reachable
    import redis

    stale = redis.Redis.from_url(reachable)
    assert int(stale.get(tokens_key)) == 0  # what Redis missed
    with pytest.raises(TurnError):
        budget_check(user.pk, None)
    assert int(stale.get(tokens_key)) == 150  # dropped, then seeded from the database
    assert spending.status() == "ok"


def test_without_the_database_the_check_lets_the_prompt_through(monkeypatch):
    """Budgets unreadable (the database down): the check admits; preparing the turn needs the
    database too and refuses it with storage_failed, so the check is never what locks people out."""
    user = User.objects.create_user("dbdown")
    budget_set(user_id=user.pk, api_key_id=None, limits={"daily_answers": 0})
    with pytest.raises(TurnError):
        budget_check(user.pk, None)

    def unavailable(*args):
        raise OperationalError("the database is unavailable")

    monkeypatch.setattr("chat.turns.budget.budgets_of", unavailable)
    budget_check(user.pk, None)


async def test_a_usage_record_the_database_refused_is_written_once_it_is_back(monkeypatch):
    """The database refuses the record when the answer ends: the counters take the charge at
    once, and the record is written in the background when the database answers again."""
    from chat.stores import storage
    from chat.turns import budget

    user = await sync_to_async(User.objects.create_user)("late")
    await sync_to_async(budget_set)(user_id=user.pk, api_key_id=None, limits={"daily_tokens": 10})
    await sync_to_async(budget_check)(user.pk, None)  # counters seeded
    real = budget.usage_record
    refusals = [OperationalError("the database is locked")]

    def flaky(**record):
        if refusals:
            raise refusals.pop()
        real(**record)

    monkeypatch.setattr(budget, "usage_record", flaky)
    monkeypatch.setattr(storage, "LATE_STORE_DELAYS", (0.0, 0.0))
    await budget.answer_charge(user_id=user.pk, api_key_id=None, policy="chat", tokens=12)
    assert await sync_to_async(spent_tokens)(user) == 0  # not yet in the database...
    with pytest.raises(TurnError):  # ...but counted
        await sync_to_async(budget_check)(user.pk, None)
    await asyncio.gather(*storage._late_stores)
    assert await sync_to_async(spent_tokens)(user) == 12


def test_a_counter_is_one_total_for_every_process():
    """Two processes' counters (two instances) charging at once from many threads: one total."""
    user = User.objects.create_user("shared")
    scope, now = Scope("user", user.pk), list(periods().values())
    first, second = SpendingCounters(), SpendingCounters()
    first.spent([scope], now)  # seeded at 0

    def charge(counters):
        for _ in range(50):
            assert counters.charge([scope], now, tokens=3, answers=1)

    threads = [threading.Thread(target=charge, args=(c,)) for c in (first, second) * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spent = second.spent([scope], now)
    assert spent[(scope, "day", "tokens")] == 600 and spent[(scope, "month", "answers")] == 200


def test_the_default_budget_is_given_to_new_accounts_only():
    before = User.objects.create_user("before")
    call_command("budget", "set", "--default", "--daily-tokens", "300", stdout=io.StringIO())
    after = User.objects.create_user("after")
    assert not Budget.objects.filter(user=before).exists()
    assert Budget.objects.get(user=after).limits() == {"daily_tokens": 300}
    assert BudgetDefault.objects.count() == 1


def test_the_budget_command_sets_shows_and_refuses_clearly():
    user = User.objects.create_user("scripted")
    key, _ = apikey_create(user=user, name="ci")
    out = io.StringIO()
    call_command(
        "budget",
        "set",
        "--user",
        "scripted",
        "--daily-tokens",
        "200",
        "--monthly-answers",
        "9",
        stdout=out,
    )
    call_command(
        "budget",
        "set",
        "--user",
        "scripted",
        "--key",
        key.prefix,
        "--daily-answers",
        "3",
        stdout=out,
    )
    assert Budget.objects.get(user=user, api_key=None).limits() == {
        "daily_tokens": 200,
        "monthly_answers": 9,
    }
    assert Budget.objects.get(api_key=key).limits() == {"daily_answers": 3}
    budget_charge(user_id=user.pk, api_key_id=key.pk, policy="chat", tokens=50)
    out = io.StringIO()
    call_command("budget", "show", "--user", "scripted", stdout=out)
    assert "daily tokens 50/200, 150 left" in out.getvalue()
    assert f"key {key.prefix}…: daily answers 1/3, 2 left" in out.getvalue()
    call_command("budget", "set", "--user", "scripted", "--daily-tokens", "none", stdout=out)
    assert Budget.objects.get(user=user, api_key=None).limits() == {"monthly_answers": 9}
    call_command("budget", "set", "--user", "scripted", "--clear", stdout=out)
    assert not Budget.objects.filter(user=user, api_key=None).exists()
    for args, says in (
        (["--user", "nobody", "--daily-tokens", "5"], "no user 'nobody'"),
        (["--user", "scripted", "--key", "sk-nothere", "--daily-tokens", "5"], "no API key"),
        (["--user", "scripted"], "nothing to set"),
    ):
        with pytest.raises(CommandError, match=says):
            call_command("budget", "set", *args, stdout=io.StringIO())
    for bad in ("-5", "lots", "1.5"):
        with pytest.raises(CommandError, match="whole number|negative"):
            call_command("budget", "set", "--user", "scripted", "--daily-tokens", bad)


def test_the_usage_page_shows_each_day_by_policy_and_what_is_left():
    user = User.objects.create_user("reader")
    budget_set(user_id=user.pk, api_key_id=None, limits={"daily_tokens": 100})
    budget_charge(user_id=user.pk, api_key_id=None, policy="chat", tokens=30, prompt_tokens=12)
    usage_record(
        user_id=user.pk,
        api_key_id=None,
        policy="json",
        tokens=5,
        answers=1,
        day=datetime.now(UTC).date() - timedelta(days=3),
    )
    assert Client().get("/account/usage/").status_code == 302  # sign in first
    browser = Client()
    browser.force_login(user)
    page = browser.get("/account/usage/").content.decode()
    assert "<td>chat</td><td>30</td><td>1</td>" in page and "<td>json</td><td>5</td>" in page
    assert '<td>100</td>\n        <td>30</td>\n        <td class="left">70</td>' in page
    assert 'href="/account/usage/"' in browser.get("/").content.decode()


def test_the_admin_usage_page_filters_draws_and_exports_csv():
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    key, _ = apikey_create(user=bob, name="bot")
    usage_record(user_id=alice.pk, api_key_id=None, policy="chat", tokens=11, answers=1)
    usage_record(user_id=bob.pk, api_key_id=key.pk, policy="json", tokens=22, answers=2)
    staff = Client()
    staff.force_login(User.objects.create_superuser("boss", password="x"))
    page = staff.get("/admin/usage/?days=7").content.decode()
    assert 'id="chart-tokens-title"' in page and "<polyline" in page
    assert ">alice<" in page and f">{key.prefix}…<" in page
    exported = staff.get("/admin/usage/?days=7&user=bob&format=csv")
    assert exported["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.content.decode())))
    assert [(r["user"], r["key"], r["policy"], r["tokens"], r["answers"]) for r in rows] == [
        ("bob", key.prefix, "json", "22", "2")
    ]
    nobody = Client()
    nobody.force_login(alice)
    assert nobody.get("/admin/usage/").status_code == 302  # the admin's login


def _sample(name: str, labels: dict) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_prometheus_counts_per_policy_never_per_user():
    user = User.objects.create_user("metered")
    tokens = _sample("chat_budget_tokens_charged_total", {"policy": "metered-policy"})
    budget_charge(user_id=user.pk, api_key_id=None, policy="metered-policy", tokens=9)
    assert _sample("chat_budget_tokens_charged_total", {"policy": "metered-policy"}) == tokens + 9
    budget_set(user_id=user.pk, api_key_id=None, limits={"daily_answers": 1})
    refusals = _sample("chat_budget_refusals_total", {"period": "day", "kind": "answers"})
    with pytest.raises(TurnError):
        budget_check(user.pk, None)
    assert (
        _sample("chat_budget_refusals_total", {"period": "day", "kind": "answers"}) == refusals + 1
    )
    for metric in REGISTRY.collect():
        if metric.name.startswith("chat_budget"):
            assert all(
                set(s.labels) <= {"policy", "period", "kind", "operation"} for s in metric.samples
            )


def test_an_error_event_carries_left_and_resets_at_only_when_a_budget_refused():
    assert "left" not in event_json(Error("r", "busy", "wait"))
    body = event_json(
        Error("r", "quota_exceeded", "spent", left={"daily_tokens": 0}, resets_at="Z")
    )
    assert '"left": {"daily_tokens": 0}, "resets_at": "Z"' in body


async def cookieless_socket(address: str) -> ChatClient:
    """A visitor with no cookie: a session of its own, from `address`."""
    from project.asgi import application

    chat = ChatClient(application)
    chat.communicator.scope["client"] = (address, 40000)
    return await chat.connect()


async def spend_until_refused(chat: ChatClient) -> tuple[list[int], dict]:
    """Prompts until one is refused: the tokens each answer generated, and the refusal."""
    generated: list[int] = []
    for n in range(12):
        request_id = await chat.prompt(f"Name an animal, number {n}.", policy="tiny")
        event = await chat.receive()
        if event["type"] == "error":
            return generated, event
        events = [event, *await chat.receive_until("done", request_id)]
        generated.append(events[-1]["metrics"]["new_tokens"])
    raise AssertionError(f"never refused after {generated}")


async def test_a_visitor_has_a_budget_per_session_and_per_address(runtime, settings):
    """A user whose budget is spent used to sign out and go on as a visitor, without limit.
    Visitors now spend a budget per session and one per client address (a new cookie is free),
    and are refused as users are: `quota_exceeded` with what is left and when it frees up."""
    from chat.models import OutputPolicy

    await sync_to_async(OutputPolicy.objects.create)(name="tiny", slug="tiny", max_new_tokens=6)
    settings.CHAT_RATE_LIMITS = {
        **settings.CHAT_RATE_LIMITS,
        "visitor_tokens": (10, 86400.0),
        "visitor_address_tokens": (18, 86400.0),
    }
    first = await cookieless_socket("203.0.113.7")
    try:
        generated, refusal = await spend_until_refused(first)
    finally:
        await first.close()
    assert generated and sum(generated[:-1]) < 10 <= sum(generated)
    assert refusal["code"] == "quota_exceeded"
    assert refusal["left"]["visitor_tokens"] == 0 and refusal["resets_at"].endswith("Z")
    assert "sign in" in refusal["message"]

    # A new session from the same address goes on only until the address's budget is spent.
    second = await cookieless_socket("203.0.113.7")
    try:
        more, refusal = await spend_until_refused(second)
    finally:
        await second.close()
    assert sum(generated) + sum(more[:-1]) < 18 <= sum(generated) + sum(more)
    assert refusal["code"] == "quota_exceeded" and refusal["left"]["visitor_address_tokens"] == 0
    assert "this address" in refusal["message"]

    # /api refuses a visitor from that address with 429; another address is still served.
    response = await sync_to_async(Client(REMOTE_ADDR="203.0.113.7").post)(
        "/api/chat", {"text": "Hi."}, content_type="application/json"
    )
    assert response.status_code == 429 and response.json()["code"] == "quota_exceeded"
    elsewhere = await cookieless_socket("198.51.100.9")
    try:
        request_id = await elsewhere.prompt("Name a colour.", policy="tiny")
        assert (await elsewhere.receive_until("done", request_id))[-1]["metrics"]["new_tokens"]
    finally:
        await elsewhere.close()
