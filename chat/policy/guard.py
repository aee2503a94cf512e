"""A guard model: a chat model behind an OpenAI-compatible `/v1/chat/completions` URL (a Llama
Guard served by vLLM, or any instruct model) asked whether the answer is safe, Llama Guard's
way: the first line of its reply is `safe` or `unsafe`, the second the violated categories."""

from __future__ import annotations

import re
from typing import Any, Literal

from . import reach
from .http import ServiceError, check_env_name, check_url, post_json, service_failed
from .moderation import ALLOWED, ModerationHook, Verdict

__all__ = ["GuardModelHook", "CATEGORIES", "guard_prompt", "parse_assessment"]

# Llama Guard 3's hazard categories (MLCommons taxonomy); its replies name them by code.
CATEGORIES = {
    "S1": "Violent Crimes",
    "S2": "Non-Violent Crimes",
    "S3": "Sex-Related Crimes",
    "S4": "Child Sexual Exploitation",
    "S5": "Defamation",
    "S6": "Specialized Advice",
    "S7": "Privacy",
    "S8": "Intellectual Property",
    "S9": "Indiscriminate Weapons",
    "S10": "Hate",
    "S11": "Suicide & Self-Harm",
    "S12": "Sexual Content",
    "S13": "Elections",
    "S14": "Code Interpreter Abuse",
}
_CODE = re.compile(r"\bS\d{1,2}\b")


def guard_prompt(text: str) -> str:
    """Llama Guard's task prompt around the answer, as its chat template writes it."""
    categories = "\n".join(f"{code}: {name}." for code, name in CATEGORIES.items())
    return (
        "Task: Check if there is unsafe content in 'Agent' messages in conversations according "
        "to our safety policy with the below categories.\n\n"
        f"<BEGIN UNSAFE CONTENT CATEGORIES>\n{categories}\n<END UNSAFE CONTENT CATEGORIES>\n\n"
        f"<BEGIN CONVERSATION>\n\nAgent: {text}\n\n<END CONVERSATION>\n\n"
        "Provide your safety assessment for ONLY THE LAST Agent message in the above "
        "conversation:\n - First line must read 'safe' or 'unsafe'.\n - If unsafe, a second "
        "line must include a comma-separated list of violated categories."
    )


def parse_assessment(reply: str) -> tuple[bool, tuple[str, ...]]:
    """(safe, category names) from a guard's reply; ServiceError when it says neither."""
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    verdict = lines[0].lower().rstrip(".") if lines else ""
    if verdict == "safe":
        return True, ()
    if verdict != "unsafe":
        raise ServiceError(
            "the guard model answered neither safe nor unsafe", f"it answered {reply[:80]!r}"
        )
    codes = _CODE.findall(" ".join(lines[1:]))
    return False, tuple(CATEGORIES.get(code, code) for code in dict.fromkeys(codes))


class GuardModelHook(ModerationHook):
    """Asks a guard model at `url` (OpenAI-compatible chat completions) whether the answer is
    safe, and withdraws it when the model says unsafe, with the categories it names. `style`
    "prompt" sends Llama Guard's task prompt as one user message (works with any instruct
    model); "chat" sends the answer as an assistant turn, for a Llama Guard whose own chat
    template writes the task. If the model fails, is slower than `timeout_s` or answers
    neither safe nor unsafe, `fail_open` lets the answer through (logged); otherwise it is
    withdrawn. Each check is one generation of up to `max_tokens` tokens."""

    blocking = True

    def __init__(
        self,
        *,
        url: str = "http://127.0.0.1:8000/v1/chat/completions",
        model: str = "meta-llama/Llama-Guard-3-1B",
        api_key_env: str = "",
        timeout_s: float = 5.0,
        fail_open: bool = False,
        style: Literal["prompt", "chat"] = "prompt",
        max_tokens: int = 20,
    ) -> None:
        self.url = check_url(url)
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a model name, not {model!r}")
        self.model = model
        self.api_key_env = check_env_name(api_key_env)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
            raise ValueError(f"timeout_s must be a number of seconds, not {timeout_s!r}")
        if not 0 < timeout_s <= 60:
            raise ValueError(f"timeout_s must be above 0 and at most 60, not {timeout_s}")
        self.timeout_s = float(timeout_s)
        if not isinstance(fail_open, bool):
            raise ValueError(f"fail_open must be true or false, not {fail_open!r}")
        self.fail_open = fail_open
        if style not in ("prompt", "chat"):
            raise ValueError(f"style must be 'prompt' or 'chat', not {style!r}")
        self.style = style
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, not {max_tokens!r}")
        self.max_tokens = max_tokens

    def messages(self, text: str) -> list[dict[str, str]]:
        if self.style == "chat":
            # Llama Guard judges the last turn; a neutral user turn stands before the answer.
            return [{"role": "user", "content": "..."}, {"role": "assistant", "content": text}]
        return [{"role": "user", "content": guard_prompt(text)}]

    def reach_problems(self) -> list[str]:
        return reach.problems(self.url, self.api_key_env)

    def check(self, text: str, *, final: bool) -> Verdict:
        if not text.strip():
            return ALLOWED
        body = {
            "model": self.model,
            "messages": self.messages(text),
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": False,
        }
        try:
            reply = post_json(
                self.url, body, api_key_env=self.api_key_env, timeout_s=self.timeout_s
            )
            safe, categories = parse_assessment(_content(reply))
        except ServiceError as exc:
            return service_failed("guard", "guard model", exc, fail_open=self.fail_open)
        if safe:
            return ALLOWED
        named = ", ".join(categories) or "no category named"
        return Verdict(False, f"guard model: unsafe ({named})", categories or ("unsafe",))


def _content(reply: dict[str, Any]) -> str:
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ServiceError("the reply has no choices[0].message.content") from None
    if not isinstance(content, str):
        raise ServiceError("the reply's message content is not text")
    return content
