"""The OutputPolicy rows staff store, turned into what a running turn needs.

The judging itself lives in chat/policy/ (no Django); this module reads the stored
rows, builds their hooks, and says what is wrong with a row before the admin saves it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings

from ..engine.sampling_params import POLICY_SETTINGS, SamplingParams
from ..engine.text.eos import token_id
from ..models import OutputPolicy
from ..policy import (
    BlocklistHook,
    HookConfigError,
    ModerationHook,
    ToolSpec,
    load_hook,
    schema_errors,
)
from ..policy.tool_calls import TOOL_EXAMPLE, tools_instruction

log = logging.getLogger(__name__)


# Measured with `manage.py answerquality` (docs/decoding.md): it ends loops on everyday prose
# without cutting answers short. Structured policies keep 1.0 (a JSON answer repeats its quotes).
PROSE_REPETITION_PENALTY = 1.1


class UnknownPolicy(LookupError):
    code = "unknown_policy"


class ToolsRefused(ValueError):
    """A request's tools that its policy cannot serve (a policy with its own schema)."""

    code = "bad_tools"


@dataclass(frozen=True)
class ResolvedPolicy:
    """An immutable copy of a policy at one version, safe to use for a whole turn."""

    id: int | None
    slug: str
    version: int
    mode: str
    schema: dict | None = None
    constrained: bool = False
    examples: tuple[tuple[str, str], ...] = ()
    hooks: tuple[ModerationHook, ...] = ()
    holdback_chars: int = 0
    failure_action: str = "reject"
    fallback_text: str = ""
    max_retries: int = 0
    system_prompt: str = ""
    # Every decoding setting; its eos ids are added per request, from `extra_eos_tokens`.
    sampling: SamplingParams = field(default_factory=SamplingParams)
    extra_eos_tokens: tuple[str, ...] = ()
    cache_enabled: bool = False
    cache_ttl_seconds: int = 0
    require_review: bool = False
    snapshot: dict = field(default_factory=dict, compare=False)
    # What one request changed (PolicyOverride, SamplingChanges), as plain JSON; part of the
    # answer's identity when not empty (chat/turns/identity.py).
    overrides: dict = field(default_factory=dict, compare=False)
    # The functions the answer may call (a request's `tools`); the answer is then held and
    # its calls judged (chat/policy/tool_calls.py).
    tools: ToolSpec | None = None
    # How a failed answer is presented to its user (chat/policy/explanation.py); no part of
    # the answer, so left out of its identity.
    description: str = ""
    show_failed_text: bool = True


@dataclass(frozen=True)
class PolicyOverride:
    """One request's changes to its policy (the OpenAI-compatible API's parameters); its
    decoding settings are apart, as SamplingChanges (engine/sampling_params.py).

    Args:
        system_prompt: replaces the policy's system prompt.
        schema: the answer must be JSON valid for it: decoding is constrained to it (on the
            local engine; a remote server gets it as `response_format`), and the turn buffers,
            validates and re-asks. A policy with its own schema keeps it: the policy's schema
            wins (a request never loosens what staff configured), and is then constrained too.
        tools: the functions the answer may call, told in the system prompt; decoding is
            constrained to prose or calls. A policy with its own schema refuses them
            (ToolsRefused): its answers are its schema's.
    """

    system_prompt: str | None = None
    schema: dict | None = None
    tools: ToolSpec | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON, kept with the answer it made (chat/turns/prepare.py)."""
        return {
            "system_prompt": self.system_prompt,
            "schema": self.schema,
            "tools": self.tools.as_dict() if self.tools is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicyOverride:
        """The override `as_dict` wrote."""
        return cls(
            system_prompt=data["system_prompt"],
            schema=data["schema"],
            tools=ToolSpec.from_dict(data["tools"]) if data["tools"] is not None else None,
        )

    def apply(self, policy: ResolvedPolicy) -> ResolvedPolicy:
        changes: dict = {}
        system_prompt = policy.system_prompt if self.system_prompt is None else self.system_prompt
        if self.tools is not None:
            if policy.schema is not None:
                raise ToolsRefused(
                    f"the policy {policy.slug!r} answers only with its own JSON Schema; "
                    "call tools through a policy without one"
                )
            instruction = tools_instruction(self.tools)
            system_prompt = f"{system_prompt}\n\n{instruction}" if system_prompt else instruction
            examples = (*policy.examples, TOOL_EXAMPLE)  # the last example shows a call
            changes.update(mode="buffer", tools=self.tools, examples=examples)
        if self.schema is not None:
            schema = policy.schema if policy.schema is not None else self.schema
            # A small model needs the schema in its instructions, not only in the re-ask.
            instruction = "Reply only with JSON that matches this JSON Schema: " + json.dumps(
                schema, separators=(",", ":")
            )
            system_prompt = f"{system_prompt}\n\n{instruction}" if system_prompt else instruction
            # Strict or not, a requested schema binds: a grammar makes the answer valid by
            # construction, and validation and re-asks stay for what it cannot express.
            changes.update(mode="buffer", schema=schema, constrained=True)
        if system_prompt != policy.system_prompt:
            changes["system_prompt"] = system_prompt
        if not changes:
            return policy
        recorded = {
            k: v.as_dict() if isinstance(v, ToolSpec) else list(v) if isinstance(v, tuple) else v
            for k, v in changes.items()
        }
        return replace(policy, **changes, overrides=recorded)


def builtin_policy() -> ResolvedPolicy:
    """Used when no policy is stored at all: plain streamed prose with the server defaults and
    the shipped `chat` policy's penalty against loops."""
    return ResolvedPolicy(
        id=None,
        slug="builtin",
        version=0,
        mode="stream",
        system_prompt=settings.CHAT_SYSTEM_PROMPT,
        sampling=SamplingParams(
            max_new_tokens=settings.CHAT_MAX_NEW_TOKENS,
            repetition_penalty=PROSE_REPETITION_PENALTY,
        ),
    )


def build_hooks(policy) -> list[ModerationHook]:
    """The policy's configured hooks plus a blocklist hook for the terms typed in the admin."""
    hooks = []
    for index, entry in enumerate(policy.moderation_hooks or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("hook"), str):
            raise HookConfigError(
                f'hook {index + 1}: expected an object like {{"hook": "blocklist", "settings": {{}}}}'
            )
        settings_ = entry.get("settings") or {}
        if not isinstance(settings_, dict):
            raise HookConfigError(f"hook {index + 1}: settings must be an object")
        hooks.append(load_hook(entry["hook"], settings_))
    terms = [line.strip() for line in (policy.blocklist_terms or "").splitlines() if line.strip()]
    if terms:
        hooks.append(BlocklistHook(terms=terms))
    return hooks


_compiled: dict[tuple[int, int], ResolvedPolicy] = {}


def resolve(policy) -> ResolvedPolicy:
    """A stored policy as a ResolvedPolicy, compiled once per (id, version)."""
    key = (policy.pk, policy.version)
    if key not in _compiled:
        _compiled[key] = compile_policy(policy)
    return _compiled[key]


def compile_policy(policy) -> ResolvedPolicy:
    """Any policy row as a ResolvedPolicy, never remembered: an unsaved draft (the admin's
    workbench) shares its id and version with the stored row it would replace."""
    return ResolvedPolicy(
        id=policy.pk,
        slug=policy.slug,
        version=policy.version,
        mode=policy.effective_mode,
        schema=policy.json_schema,
        constrained=policy.constrained and policy.json_schema is not None,
        examples=tuple((e["user"], e["assistant"]) for e in policy.examples or ()),
        hooks=tuple(build_hooks(policy)),
        holdback_chars=policy.holdback_chars,
        failure_action=policy.failure_action,
        fallback_text=policy.fallback_text,
        max_retries=policy.max_retries,
        system_prompt=policy.system_prompt or settings.CHAT_SYSTEM_PROMPT,
        sampling=stored_sampling(policy).with_changes(
            max_new_tokens=min(policy.max_new_tokens, settings.CHAT_MAX_NEW_TOKENS_CAP)
        ),
        extra_eos_tokens=tuple(policy.extra_eos_tokens or ()),
        cache_enabled=policy.cache_enabled,
        cache_ttl_seconds=policy.cache_ttl_seconds,
        require_review=policy.require_review,
        snapshot=policy.snapshot(),
        description=policy.description,
        show_failed_text=policy.show_failed_text,
    )


def stored_sampling(policy) -> SamplingParams:
    """A policy row's decoding settings, one column each (POLICY_SETTINGS)."""
    values = {name: getattr(policy, name) for name in POLICY_SETTINGS}
    values["stop_strings"] = tuple(values["stop_strings"] or ())
    return SamplingParams(**values)


def policy_for(slug: str | None) -> ResolvedPolicy:
    """The named policy, else the default one; UnknownPolicy for a slug nobody configured."""
    if slug is not None:
        policy = OutputPolicy.objects.filter(slug=slug).first()
        if policy is None:
            known = ", ".join(OutputPolicy.objects.values_list("slug", flat=True)) or "none"
            raise UnknownPolicy(f"no output policy {slug!r} (known: {known})")
        return resolve(policy)
    policy = OutputPolicy.objects.filter(is_default=True).first()
    return resolve(policy) if policy is not None else builtin_policy()


# -- validation on save -------------------------------------------------------------


def _string_list(value, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{name} must be a JSON list of non-empty strings")
    return value


def policy_errors(policy, *, tokenizer=None) -> dict[str, list[str]]:
    """Every problem with a policy, by form field, in words staff can act on.

    Stop strings and extra eos tokens are checked against `tokenizer` when one is given (the
    admin form hands over the model's); without it those two are checked for shape only.
    """
    errors: dict[str, list[str]] = {}
    if policy.json_schema is not None:
        problems = schema_errors(policy.json_schema)
        if problems:
            errors["json_schema"] = [f"not a valid JSON Schema: {p}" for p in problems]
    try:
        build_hooks(policy)
    except HookConfigError as exc:
        errors["moderation_hooks"] = [str(exc)]
    except ValueError as exc:  # a blocklist term the hook refuses
        errors["blocklist_terms"] = [str(exc)]
    examples = policy.examples or []
    if not isinstance(examples, list) or not all(
        isinstance(e, dict)
        and set(e) == {"user", "assistant"}
        and all(isinstance(v, str) for v in e.values())
        for e in examples
    ):
        errors["examples"] = ['must be a list of {"user": "...", "assistant": "..."} objects']
    if policy.constrained and policy.json_schema is None:
        errors["constrained"] = ["constrained decoding needs a JSON Schema"]
    numbers = {name: getattr(policy, name) for name in POLICY_SETTINGS if name != "stop_strings"}
    sampling = SamplingParams(**numbers)
    sampling_errors = sampling.errors()
    for name, problem in sampling_errors.items():  # stop strings: below
        errors[name] = [problem]
    if policy.max_new_tokens > settings.CHAT_MAX_NEW_TOKENS_CAP:
        errors["max_new_tokens"] = [
            f"at most {settings.CHAT_MAX_NEW_TOKENS_CAP} (CHAT_MAX_NEW_TOKENS_CAP)"
        ]
    if policy.cache_enabled and not sampling_errors and not sampling.reproducible:
        errors["cache_enabled"] = [
            "a policy that samples (temperature above 0) without a seed never gives the same "
            "answer twice, so it cannot be cached: set a seed, or turn caching off"
        ]
    if policy.fallback_to_default and policy.engine_id is None:
        errors["fallback_to_default"] = ["the default engine already answers this policy"]
    elif policy.fallback_to_default and policy.fallback_engine_id is not None:
        errors["fallback_to_default"] = ["name a fallback engine or the default one, not both"]
    if policy.failure_action == "fallback" and not policy.fallback_text.strip():
        errors["fallback_text"] = ["the fallback action needs a fallback text"]

    try:
        for stop in _string_list(policy.stop_strings or [], "stop strings"):
            if (
                tokenizer is not None
                and tokenizer.decode(tokenizer(stop, add_special_tokens=False)["input_ids"]) != stop
            ):
                errors.setdefault("stop_strings", []).append(
                    f"{stop!r} cannot be produced by this model's tokenizer"
                )
    except ValueError as exc:
        errors["stop_strings"] = [str(exc)]
    try:
        for token in _string_list(policy.extra_eos_tokens or [], "extra eos tokens"):
            if tokenizer is not None and token_id(tokenizer, token) is None:
                errors.setdefault("extra_eos_tokens", []).append(
                    f"{token!r} is not a single token of this model's vocabulary"
                )
    except ValueError as exc:
        errors["extra_eos_tokens"] = [str(exc)]
    return errors
