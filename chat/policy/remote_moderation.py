"""A moderation service in OpenAI's `/v1/moderations` shape (OpenAI's own, or any compatible
server): the answer so far is sent, the flagged categories come back."""

from __future__ import annotations

from typing import Any

from . import reach
from .http import ServiceError, check_env_name, check_url, post_json, service_failed
from .moderation import ALLOWED, ModerationHook, Verdict

__all__ = ["RemoteModerationHook"]


def _timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 60:
        raise ValueError(
            f"timeout_s must be a number of seconds above 0 and at most 60, not {value!r}"
        )
    return float(value)


class RemoteModerationHook(ModerationHook):
    """Sends the answer to a `/v1/moderations` endpoint and withdraws it when a counted category
    is flagged: all of them, or only `categories`; with `threshold` above 0 a category counts
    when its score reaches it instead of when the service flags it. The key is read from the
    operator's hook secret `api_key_env` names. If the service fails or is slower than
    `timeout_s`, `fail_open` lets the answer through (logged); otherwise it is withdrawn."""

    blocking = True

    def __init__(
        self,
        *,
        url: str = "https://api.openai.com/v1/moderations",
        api_key_env: str = "OPENAI_API_KEY",
        model: str = "omni-moderation-latest",
        timeout_s: float = 2.0,
        fail_open: bool = False,
        categories: list[str] = [],  # noqa: B006 - never mutated; a form reads the default
        threshold: float = 0.0,
    ) -> None:
        self.url = check_url(url)
        self.api_key_env = check_env_name(api_key_env)
        if not isinstance(model, str):
            raise ValueError(f"model must be a string, not {model!r}")
        self.model = model
        self.timeout_s = _timeout(timeout_s)
        if not isinstance(fail_open, bool):
            raise ValueError(f"fail_open must be true or false, not {fail_open!r}")
        self.fail_open = fail_open
        if isinstance(categories, str) or not all(isinstance(c, str) and c for c in categories):
            raise ValueError("categories must be a list of category names")
        self.categories = tuple(categories)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ValueError(f"threshold must be a number, not {threshold!r}")
        if not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be between 0 and 1, not {threshold}")
        self.threshold = float(threshold)

    def reach_problems(self) -> list[str]:
        return reach.problems(self.url, self.api_key_env)

    def check(self, text: str, *, final: bool) -> Verdict:
        if not text.strip():
            return ALLOWED
        body = {"input": text, **({"model": self.model} if self.model else {})}
        try:
            reply = post_json(
                self.url, body, api_key_env=self.api_key_env, timeout_s=self.timeout_s
            )
            flagged = self._flagged(reply)
        except ServiceError as exc:
            return service_failed(
                "remote_moderation", "moderation service", exc, fail_open=self.fail_open
            )
        if not flagged:
            return ALLOWED
        return Verdict(False, "moderation service flagged: " + ", ".join(flagged), flagged)

    def _flagged(self, reply: dict[str, Any]) -> tuple[str, ...]:
        """The counted categories the reply flags, in the service's order."""
        results = reply.get("results")
        if not isinstance(results, list) or not results or not isinstance(results[0], dict):
            raise ServiceError("the reply has no results[0] (not a /v1/moderations answer)")
        result = results[0]
        if self.threshold:
            scores = result.get("category_scores")
            if not isinstance(scores, dict):
                raise ServiceError("the reply has no category_scores")
            hits = [
                name
                for name, score in scores.items()
                if isinstance(score, int | float) and score >= self.threshold
            ]
        else:
            marks = result.get("categories")
            if not isinstance(marks, dict):
                raise ServiceError("the reply has no categories")
            hits = [name for name, hit in marks.items() if hit is True]
            if not hits and result.get("flagged") is True and not self.categories:
                hits = ["flagged"]
        return tuple(name for name in hits if not self.categories or name in self.categories)
