"""Budgets against live daphne processes and the real model: the openai package refused with
RateLimitError `insufficient_quota`, and two processes sharing Redis and a database holding one
budget between them."""

from __future__ import annotations

import json
import threading

import openai
import pytest

from harness.liveserver import LiveServer, fresh_database_like
from tests.conftest import LIVE_CACHE_URL

pytestmark = pytest.mark.integration

MAX_TOKENS = 48  # one answer's most; the budgets below take a few answers each
LONG = "Write a long story about a dragon who learns to bake bread, part {n}."

MAKE_KEYS = """
import json
from django.contrib.auth import get_user_model
from chat.stores.apikeys import apikey_create
user, _ = get_user_model().objects.get_or_create(username={name!r})
print(json.dumps([apikey_create(user=user, name=str(n))[1] for n in range({count})]))
"""

SPENT = """
from django.db.models import Sum
from chat.models import Usage
print(Usage.objects.filter(user__username={name!r}).aggregate(t=Sum("tokens"))["t"] or 0)
"""


@pytest.fixture(scope="module")
def database_url():
    """A fresh PostgreSQL database for the two servers, dropped at the end of the session."""
    return fresh_database_like("postgres://postgres@127.0.0.1:5432/chat")


@pytest.fixture(scope="module")
def servers(database_url, tmp_path_factory):
    """Two daphne processes on one database and one Redis (this suite's own database in it)."""
    env = {
        "REDIS_URL": LIVE_CACHE_URL,
        "CHAT_CACHE_REDIS_URL": LIVE_CACHE_URL,
        "CHAT_ENGINE": "threads=1",
        "CHAT_RATE_LIMITS": "prompt=0",
    }
    workdir = tmp_path_factory.mktemp("budgets")
    started = LiveServer.start_together(
        [LiveServer(workdir, database_url=database_url, **env) for _ in range(2)]
    )
    try:
        yield started
    finally:
        for server in started:
            server.stop()


def keys_of(server, name: str, count: int = 1) -> list[str]:
    out = server.manage("shell", "-c", MAKE_KEYS.format(name=name, count=count))
    return json.loads(out.strip().splitlines()[-1])


def spent(server, name: str) -> int:
    return int(server.manage("shell", "-c", SPENT.format(name=name)).strip().splitlines()[-1])


def client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=2, timeout=120)


def ask_until_refused(server, key: str, tag: str, most: int = 40) -> tuple[list[int], Exception]:
    """Completions one after another until one is refused: the tokens of each, and the refusal."""
    generated: list[int] = []
    for n in range(most):
        try:
            reply = client(server, key).chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": LONG.format(n=f"{tag}{n}")}],
                max_tokens=MAX_TOKENS,
            )
        except openai.RateLimitError as refusal:
            return generated, refusal
        generated.append(reply.usage.completion_tokens)
    raise AssertionError(f"never refused after {generated}")


def test_the_openai_package_raises_rate_limit_error_insufficient_quota(servers):
    """A key whose user has 200 tokens a day: answered until they are spent, then a 429 the
    package raises as RateLimitError with code insufficient_quota (max_retries=2 does not retry
    it: the server says x-should-retry: false); spent at most the budget plus one answer."""
    server = servers[0]
    (key,) = keys_of(server, "quota")
    server.manage("budget", "set", "--user", "quota", "--daily-tokens", "200")
    generated, refusal = ask_until_refused(server, key, "q")
    assert refusal.status_code == 429 and refusal.code == "insufficient_quota"
    assert refusal.body["type"] == "insufficient_quota"
    assert refusal.response.headers["x-should-retry"] == "false"
    assert 0 < int(refusal.response.headers["Retry-After"]) <= 86400
    assert "daily budget is spent; it resets at 00:00 UTC" in refusal.message
    total = spent(server, "quota")
    assert total == sum(generated)
    assert sum(generated[:-1]) < 200 <= total <= 200 + MAX_TOKENS
    print(f"one process: {total} tokens spent of 200 in {len(generated)} answers")
    # Refused again at once, on the other process too.
    with pytest.raises(openai.RateLimitError):
        client(servers[1], key).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert "quota" in server.manage("budget", "show", "--user", "quota")


def test_two_processes_hold_one_budget_between_them(servers):
    """One user asking through both processes at once, each client one answer after another:
    together they spend at most the budget plus one answer per process."""
    first, second = servers
    keys = keys_of(first, "pair", count=2)
    first.manage("budget", "set", "--user", "pair", "--daily-tokens", "150")
    results: dict[int, tuple[list[int], Exception]] = {}

    def run(index: int) -> None:
        results[index] = ask_until_refused(servers[index], keys[index], f"p{index}-")

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(results) == {0, 1}
    for _generated, refusal in results.values():
        assert refusal.code == "insufficient_quota"
    total = spent(first, "pair")
    assert total == sum(sum(generated) for generated, _ in results.values())
    assert 150 <= total <= 150 + 2 * MAX_TOKENS
    counts = [len(generated) for generated, _ in results.values()]
    print(f"two processes: {total} tokens spent of 150 in {counts} answers")
