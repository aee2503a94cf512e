"""Preparing a Continue (sync, in a worker thread): the rest of an answer cut off at the token
limit, written into the same message."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from ..engine.types import Backend, EngineError
from ..infra.engines import EngineSpec
from ..models import Message
from ..protocol import CONTINUABLE, Prompt
from ..stores import policy_store, user_settings
from ..stores.branches import Tree
from ..stores.selectors import Owner, branch_history, conversations_for
from .identity import answer_identity
from .prepare import Prepared, overridden, settings_of
from .prompting import fit_prompt, request_for
from .refusals import TurnError

# Answers that ended before their end through no choice of the user's: the text kept goes on.
UNFINISHED = (Message.Status.INTERRUPTED, Message.Status.FAILED)


def continuable(answer: Message) -> bool:
    """Cut off at the token limit, or interrupted (the server stopped) or failed mid-answer."""
    if answer.status == Message.Status.DONE:
        return answer.finish_reason == CONTINUABLE
    return answer.status in UNFINISHED


def prepare_continue(
    owner: Owner, prompt: Prompt, backend: Backend, engine: EngineSpec | None = None
) -> Prepared:
    """The rest of an answer cut off at the token limit, or interrupted, written into the same
    message.

    It is made with the settings its answer was made with: the stored policy and the request's
    own over it (a /v1 request's stop, max_tokens, tools..., kept on the message). It keeps the
    identity the answer was given when it was first prepared (identity.py): when it ends well,
    the whole answer is cached under it, so a repeat of that prompt gets all of it. Only while
    that identity is what those settings make of the prompt now: a policy changed since, or an
    answer stored before its request's settings were kept, would cache text made otherwise
    under it, so the answer is then no longer shared. An answer with no identity (sampled, or
    from a context only the client held) stays unshared, continued or not.
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
        tree = Tree.of(conversation)
        if tree.leaf() != answer or not continuable(answer):
            raise TurnError(
                "bad_message",
                "only the last answer of the branch shown can be continued, and only when it "
                "was cut off at the token limit or stopped before its end by a server that "
                "stopped or failed",
            )
        asked = tree.by_id.get(answer.parent_id) if answer.parent_id else None
        if asked is None or asked.role != Message.Role.USER:
            raise TurnError("bad_message", "that answer has no prompt to continue from")
        policy = (
            policy_store.resolve(answer.policy)
            if answer.policy is not None
            else policy_store.policy_for(None)
        )
        if answer.overrides:  # the request's own settings, applied as they were to its answer
            policy = overridden(policy, *settings_of(answer.overrides))
        history = branch_history(tree, upto=asked.parent_id)
        # The user's custom instructions as they are now; a /v1 answer had none. Changed since,
        # they change the identity below, which is then dropped.
        instructions = (
            "" if conversation.api_key_id is not None else user_settings.instructions_for(owner)
        )
        try:
            messages, _rendered, input_ids = fit_prompt(
                backend,
                policy,
                history,
                asked.text,
                answer_so_far=answer.text,
                instructions=instructions,
            )
            # The review record shows the prompt's model input, as if the answer was made at once.
            asked_messages, asked_rendered, asked_ids = fit_prompt(
                backend, policy, history, asked.text, instructions=instructions
            )
        except EngineError as exc:
            raise TurnError(exc.code, str(exc)) from None
        made_now = request_for(backend, policy, asked_ids, prompt.request_id, asked_messages)
        answer.status = Message.Status.STREAMING
        answer.error = ""
        answer.request_id = prompt.request_id
        answer.instance = settings.CHAT_INSTANCE
        if (answer.policy_id, answer.policy_version) != (policy.id, policy.version or None) or (
            answer.identity
            and answer_identity(backend, policy, made_now, client_context=False, engine=engine)
            != answer.identity
        ):
            answer.identity = ""  # the whole would no longer be what it named
        answer.save(
            update_fields=["status", "error", "request_id", "instance", "identity", "updated_at"]
        )
    request = request_for(backend, policy, input_ids, prompt.request_id, messages)
    return Prepared(
        conversation=conversation,
        assistant=answer,
        policy=policy,
        messages=messages,
        rendered=asked_rendered,
        request=request,
        identity=answer.identity or None,
        asked=asked.text,
        answer_so_far=answer.text,
        tokens_so_far=(answer.metrics or {}).get("new_tokens") or 0,
    )
