"""One value for every decoding setting, as vLLM's `SamplingParams`: the policy, the admin form,
`/v1`, an answer's identity, the remote request and the decode step are all built from it.

Adding a setting is one field here, the policy's column that stores it, and the step that uses
it. No torch and no Django: the web tier and the policies import it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

# Accepted ranges of the penalties against loops, (low, high) inclusive, as OpenAI and vLLM
# accept them; the admin and the OpenAI-compatible API both check against these.
PENALTY_LIMITS = {
    "repetition_penalty": (0.5, 2.0),
    "no_repeat_ngram_size": (0, 20),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
}

# A seed is any integer, as OpenAI takes it; the generator starts from it modulo 2**64.
SEED_SPACE = 2**64


class SamplingType(Enum):
    """How the next token is chosen; derived from the parameters, never stored beside them.

    It answers "may two requests share an answer?": only a GREEDY or a RANDOM_SEED one can.
    """

    GREEDY = "greedy"
    RANDOM = "random"
    RANDOM_SEED = "random_seed"


@dataclass(frozen=True)
class SamplingParams:
    """Every setting that decides which tokens an answer is made of.

    Args:
        max_new_tokens: always set; the backend caps it at its configured ceiling.
        temperature: 0 means greedy decoding.
        top_p: nucleus sampling when temperature > 0.
        seed: with temperature > 0, the row's own random generator starts from it (modulo
            2**64), so the same request samples the same answer; None draws from the process's
            generator.
        repetition_penalty: divides the logits of tokens already in the answer (1 is off).
        no_repeat_ngram_size: never repeat an n-gram of the answer this long (0 is off).
        frequency_penalty, presence_penalty: OpenAI's, over the answer so far (0 is off).
        stop_strings: cut the answer where one appears; never shown to the user.
        eos_token_ids: extra end-of-sequence ids, on top of the model's own.
        min_new_tokens: suppress eos until this many tokens (benchmarks use it for fixed lengths).
        json_schema: constrain decoding so the output is JSON valid for this schema.
        tool_grammar: constrain decoding to prose or tool calls (engine/local/constrained.py):
            {"tools": OpenAI's function tools, "tool_choice": "auto", "required" or
            {"type": "function", "function": {"name": ...}}, "parallel_tool_calls": bool}.
            A remote backend does not constrain to it; the turn validates the calls.

    Example:
        >>> SamplingParams(max_new_tokens=64, temperature=0.7, seed=7).sampling_type
        <SamplingType.RANDOM_SEED: 'random_seed'>
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop_strings: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0
    json_schema: dict[str, Any] | None = None
    tool_grammar: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Stored policies and JSON bodies hand over lists; a value is immutable all the way down.
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))

    __hash__ = None  # type: ignore[assignment]  # the schema and grammar are dicts

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature <= 0:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def reproducible(self) -> bool:
        """The same request gives the same answer, so it may be cached and shared."""
        return self.sampling_type is not SamplingType.RANDOM

    def with_changes(self, **changes: Any) -> SamplingParams:
        """A copy with `changes` (field names), unknown names refused by `replace`."""
        return replace(self, **changes) if changes else self

    def errors(self) -> dict[str, str]:
        """What is wrong with each setting, by field name; empty when all are usable."""
        errors = penalty_errors(**{name: getattr(self, name) for name in PENALTY_LIMITS})
        if not _number(self.temperature) or not 0 <= self.temperature <= 2:
            errors["temperature"] = "must be a number from 0 to 2"
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            errors["top_p"] = "must be greater than 0 and at most 1"
        if not _whole(self.max_new_tokens) or self.max_new_tokens < 1:
            errors["max_new_tokens"] = "must be at least 1"
        if self.seed is not None and (not _whole(self.seed) or isinstance(self.seed, float)):
            errors["seed"] = "must be a whole number"
        return errors

    @property
    def generator_seed(self) -> int | None:
        """The seed a generator starts from: seeds equal modulo 2**64 sample alike."""
        return None if self.seed is None else int(self.seed) % SEED_SPACE

    def identity(self) -> dict[str, Any]:
        """Every field as plain JSON, for an answer's identity. The seed counts only when it
        decides something (a greedy answer is the same whatever seed came with it)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["seed"] = self.generator_seed
        if self.sampling_type is SamplingType.GREEDY:
            values["seed"] = None
            values["top_p"] = 1.0  # read only when sampling
        values["stop_strings"] = list(self.stop_strings)
        values["eos_token_ids"] = sorted(set(self.eos_token_ids))
        return values


@dataclass(frozen=True)
class SamplingChanges:
    """One request's changes to its policy's SamplingParams, built where the request enters
    (`/v1`'s parsing); the policy they change is known only when the turn is prepared, where
    `changes_to` merges them with its params, the one place that does.

    Args:
        replaced: SamplingParams fields by name whose values replace the policy's (temperature,
            top_p, seed, the penalties); a float field's value is kept as a float.
        stop_strings: added to the policy's own.
        max_new_tokens: replaces the policy's, capped by the server's ceiling.
    """

    replaced: dict[str, Any] = field(default_factory=dict)
    stop_strings: tuple[str, ...] = ()
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        own = {f.name: f for f in fields(SamplingParams)}
        unknown = [name for name in self.replaced if name not in own or name in _ADDED_OR_CAPPED]
        if unknown:
            raise ValueError(f"not a replaceable sampling setting: {', '.join(unknown)}")
        replaced = {
            name: float(value) if isinstance(own[name].default, float) else value
            for name, value in self.replaced.items()
        }
        object.__setattr__(self, "replaced", replaced)
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))

    __hash__ = None  # type: ignore[assignment]  # `replaced` is a dict

    def changes_to(self, params: SamplingParams, *, max_new_tokens_cap: int) -> dict[str, Any]:
        """The fields of `params` these changes make different, by name, for `with_changes`."""
        changes: dict[str, Any] = dict(self.replaced)
        stops = tuple(dict.fromkeys(params.stop_strings + self.stop_strings))
        if stops != params.stop_strings:
            changes["stop_strings"] = stops
        if self.max_new_tokens is not None:
            changes["max_new_tokens"] = min(self.max_new_tokens, max_new_tokens_cap)
        return {name: v for name, v in changes.items() if getattr(params, name) != v}

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON, under the keys an answer's stored settings have always used."""
        return {
            "stop_strings": list(self.stop_strings),
            "max_new_tokens": self.max_new_tokens,
            "sampling": self.replaced,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingChanges:
        """The changes `as_dict` wrote."""
        return cls(
            replaced=data["sampling"],
            stop_strings=tuple(data["stop_strings"]),
            max_new_tokens=data["max_new_tokens"],
        )


# Fields a request adds to or caps rather than replaces (SamplingChanges' own fields).
_ADDED_OR_CAPPED = ("stop_strings", "max_new_tokens")


# The settings a stored policy keeps one column each for, under the same names (chat/models/policies.py).
POLICY_SETTINGS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "seed",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "frequency_penalty",
    "presence_penalty",
    "stop_strings",
)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == int(value)


def penalty_errors(**values: float) -> dict[str, str]:
    """What is wrong with each given penalty, by name; empty when all are in range."""
    errors = {}
    for name, value in values.items():
        low, high = PENALTY_LIMITS[name]
        if not _number(value) or not low <= value <= high:
            errors[name] = f"must be a number from {low} to {high}"
        elif name == "no_repeat_ngram_size" and (value == 1 or value != int(value)):
            errors[name] = "must be 0 (off) or a whole number from 2 to 20"
    return errors
