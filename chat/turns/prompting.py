"""What the model is asked: the chat fitted into its context, and the request.

No database and no I/O: a turn's inputs in, the model's input out.
"""

from __future__ import annotations

from ..engine.types import Backend, GenerationRequest
from ..stores.policy_store import ResolvedPolicy


def fit_prompt(
    backend: Backend,
    policy: ResolvedPolicy,
    history: list[dict],
    text: str,
    *,
    answer_so_far: str = "",
    instructions: str = "",
) -> tuple[list[dict], str, list[int]]:
    """(messages, rendered prompt, input ids); drops the oldest turns when the context is full,
    never the new prompt. Raises PromptTooLong when even the prompt alone does not fit.

    With `answer_so_far` the chat ends on that unfinished answer, for the model to go on with.
    `instructions` (the user's own, from their settings) follow the policy's system prompt in
    the one system message: chat templates take one, first.
    """
    max_new_tokens = policy.sampling.max_new_tokens
    system = "\n\n".join(part for part in (policy.system_prompt, instructions) if part)
    head = [{"role": "system", "content": system}] if system else []
    for user, assistant in policy.examples:
        head += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    tail = [{"role": "assistant", "content": answer_so_far}] if answer_so_far else []
    while True:
        messages = head + history + [{"role": "user", "content": text}] + tail
        rendered = backend.render(messages)
        input_ids = backend.encode(messages)
        if len(input_ids) + max_new_tokens <= backend.context_length or not history:
            backend.check_fits(len(input_ids), max_new_tokens)
            return messages, rendered, input_ids
        history = history[2:]


def request_for(
    backend: Backend,
    policy: ResolvedPolicy,
    input_ids: list[int],
    label: str,
    messages: list[dict],
) -> GenerationRequest:
    """The engine request for a fitted prompt under `policy`."""
    eos_ids = tuple(
        i for i in (backend.token_id(t) for t in policy.extra_eos_tokens) if i is not None
    )
    params = policy.sampling.with_changes(
        eos_token_ids=eos_ids,
        json_schema=policy.schema if policy.constrained else None,
        tool_grammar=policy.tools.grammar() if policy.tools is not None else None,
    )
    return GenerationRequest(input_ids=input_ids, params=params, label=label, messages=messages)
