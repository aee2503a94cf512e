"""Preparing a Continue (sync, in a worker thread): the rest of an answer cut off at the token
limit, written into the same message."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from ..engine.types import Backend, EngineError
from ..models import Message
from ..protocol import CONTINUABLE, Prompt
from ..stores import policy_store
from ..stores.selectors import Owner, answer_history, conversations_for
from .errors import TurnError
from .prepare import Prepared
from .prompting import fit_prompt, request_for, turn_cache_key


def prepare_continue(owner: Owner, prompt: Prompt, backend: Backend) -> Prepared:
    """The rest of an answer cut off at the token limit, written into the same message.

    When it ends well, the whole answer is cached under its prompt's own key, so a repeat of
    that prompt gets all of it.
    """
    with transaction.atomic():
        answer = (
            Message.objects.select_for_update(of=("self",))  # only the answer: policy may be NULL
            .select_related("conversation", "policy")
            .filter(
                pk=prompt.continues,
                role=Message.Role.ASSISTANT,
                conversation__in=conversations_for(owner),
            )
            .first()
        )
        if answer is None:
            raise TurnError("unknown_request", f"you have no answer {prompt.continues}")
        conversation = answer.conversation
        last = conversation.messages.filter(superseded=False).last()
        if (
            last.pk != answer.pk
            or answer.status != Message.Status.DONE
            or answer.finish_reason != CONTINUABLE
        ):
            raise TurnError(
                "bad_message",
                "only the conversation's last answer can be continued, and only when it was "
                "cut off at the token limit",
            )
        asked = conversation.messages.filter(
            role=Message.Role.USER, superseded=False, pk__lt=answer.pk
        ).last()
        if asked is None:
            raise TurnError("bad_message", "that answer has no prompt to continue from")
        policy = (
            policy_store.resolve(answer.policy)
            if answer.policy is not None
            else policy_store.policy_for(None)
        )
        history = answer_history(conversation, before=asked.pk)
        try:
            messages, _rendered, input_ids = fit_prompt(
                backend, policy, history, asked.text, answer_so_far=answer.text
            )
        except EngineError as exc:
            raise TurnError(exc.code, str(exc)) from None
        answer.status = Message.Status.STREAMING
        answer.request_id = prompt.request_id
        answer.instance = settings.CHAT_INSTANCE
        answer.save(update_fields=["status", "request_id", "instance", "updated_at"])
    request = request_for(backend, policy, input_ids, prompt.request_id, messages)
    # The cache entry (and its review record) is the prompt's, as if answered whole at once.
    asked_messages, asked_rendered, asked_ids = fit_prompt(backend, policy, history, asked.text)
    key = None
    if policy.cache_enabled and answer.policy_version == policy.version:
        asked_request = request_for(backend, policy, asked_ids, prompt.request_id, asked_messages)
        key = turn_cache_key(backend, policy, asked_rendered, asked_request)
    return Prepared(
        conversation=conversation,
        assistant=answer,
        policy=policy,
        messages=messages,
        rendered=asked_rendered,
        request=request,
        cache_key=key,
        asked=asked.text,
        answer_so_far=answer.text,
        tokens_so_far=(answer.metrics or {}).get("new_tokens") or 0,
    )
