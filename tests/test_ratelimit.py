"""The per-user rate limiter on its own, with a clock the test moves."""

import pytest

from chat.infra.ratelimit import RateLimiter

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_holds_per_key_and_frees_up_as_the_window_slides():
    """Two a minute: the third waits for the first to leave the window; other keys are not affected."""
    clock = Clock()
    limiter = RateLimiter(limit=2, window=60, clock=clock)
    assert limiter.check("a") == 0.0
    clock.now += 10
    assert limiter.check("a") == 0.0
    assert limiter.check("a") == 50.0
    assert limiter.check("b") == 0.0
    clock.now += 50
    assert limiter.check("a") == 0.0


def test_visitors_gone_for_a_window_are_forgotten():
    """Memory follows the users active in the last window, not every session ever seen."""
    clock = Clock()
    limiter = RateLimiter(limit=5, window=60, clock=clock)
    for n in range(1000):
        limiter.check(f"session:{n}")
    assert len(limiter) == 1000
    clock.now += 61
    limiter.check("session:new")
    assert len(limiter) == 1
