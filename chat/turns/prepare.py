"""Preparing a new prompt's turn (sync, in a worker thread): its policy, conversation, stored
messages, the prompt fitted to the model, and the answer's identity. A Continue is
chat/turns/continuation.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from django.conf import settings
from django.db import transaction

from ..engine.types import Backend, EngineError, GenerationRequest
from ..infra.engines import EngineSpec
from ..models import Conversation, Feedback, Message
from ..protocol import Prompt
from ..stores import feedback, policy_store
from ..stores.selectors import Owner, answer_history, conversations_for
from .identity import answer_identity
from .prompting import fit_prompt, request_for
from .refusals import TurnError

# Sampling temperature of a regenerated answer when its policy is greedy.
REGENERATE_TEMPERATURE = 0.8


@dataclass
class Prepared:
    """A turn stored and ready to queue: what the run needs from the database and the prompt."""

    conversation: Conversation
    assistant: Message
    policy: policy_store.ResolvedPolicy
    messages: list[dict]  # the chat as rendered for the model, for re-asks
    rendered: str  # the prompt's model input, for the cache's review record
    request: GenerationRequest
    identity: str | None  # what made the answer (identity.py); None: never shared
    asked: str  # the user's prompt this answer is to
    # A continuation: the answer's text and tokens so far, which the new text is appended to.
    answer_so_far: str = ""
    tokens_so_far: int = 0

    @property
    def cache_key(self) -> str | None:
        """The completion cache's key: the identity, when the policy caches."""
        return self.identity if self.policy.cache_enabled else None


@dataclass(frozen=True)
class Given:
    """What a transport may give instead of the stored defaults (the OpenAI-compatible API)."""

    history: list[dict] | None = None  # earlier turns, in place of the conversation's
    override: policy_store.PolicyOverride | None = None
    api_key_id: int | None = None

    @property
    def client_context(self) -> bool:
        """The model reads something only the client holds (earlier turns, tool results among
        them, or its own system prompt): the answer is never shared. A request's tools and
        schema are parameters, part of the identity, not context."""
        return bool(self.history) or (
            self.override is not None and self.override.system_prompt is not None
        )


def check_prompt_tokens(backend: Backend, text: str) -> None:
    """A per-prompt limit in the model's tokens; characters alone let odd text cost many tokens each."""
    limit = settings.CHAT_MAX_PROMPT_TOKENS
    if limit <= 0:
        return
    tokens = backend.token_count(text)
    if tokens > limit:
        raise TurnError(
            "prompt_too_long",
            f"the prompt is {len(text)} characters and {tokens} tokens; the limits are "
            f"{settings.CHAT_MAX_PROMPT_CHARS} characters and {limit} tokens",
        )


def overridden(
    policy: policy_store.ResolvedPolicy, override: policy_store.PolicyOverride
) -> policy_store.ResolvedPolicy:
    """`policy` with one request's settings applied (a new prompt's, or again a Continue's)."""
    try:
        return override.apply(policy)
    except policy_store.ToolsRefused as exc:
        raise TurnError(exc.code, str(exc)) from None


def prepare_prompt(
    owner: Owner, prompt: Prompt, backend: Backend, given: Given, engine: EngineSpec | None = None
) -> Prepared:
    """Resolve the policy, store the prompt and its streaming answer, fit the prompt to the model
    (`backend`, of `engine`: None is the default engine)."""
    check_prompt_tokens(backend, prompt.text)
    try:
        policy = policy_store.policy_for(prompt.policy)
    except policy_store.UnknownPolicy as exc:
        raise TurnError(exc.code, str(exc)) from None
    if given.override is not None:
        policy = overridden(policy, given.override)
    conversation = None
    if prompt.conversation is not None:
        conversation = conversations_for(owner).filter(pk=prompt.conversation).first()
        if conversation is None:
            raise TurnError(
                "unknown_conversation", f"conversation {prompt.conversation} does not exist"
            )
    with transaction.atomic():  # a replaced answer stays current if the new prompt is refused
        regenerate = prompt.replace is not None and supersede(conversation, prompt) == prompt.text
        if regenerate:  # soon after a cache hit, the hit was not what the user wanted
            feedback.implicit_signal(
                owner=owner, message_id=prompt.replace, kind=Feedback.Kind.REGENERATED
            )
        try:
            messages, rendered, input_ids = fit_prompt(
                backend,
                policy,
                answer_history(conversation) if given.history is None else given.history,
                prompt.text,
            )
        except EngineError as exc:
            raise TurnError(exc.code, str(exc)) from None
        request = request_for(backend, policy, input_ids, prompt.request_id, messages)
        if regenerate:
            # A new answer, not the same one again: sampled afresh, so never served from or
            # stored in the cache, nor shared.
            params = request.params
            request = replace(
                request,
                params=params.with_changes(
                    temperature=max(params.temperature, REGENERATE_TEMPERATURE), seed=None
                ),
            )
        identity = answer_identity(
            backend, policy, request, client_context=given.client_context, engine=engine
        )
        if conversation is None:
            conversation = Conversation.objects.create(
                user_id=owner.user_id,
                session_key="" if owner.user_id is not None else owner.session_key,
                title=Conversation.title_from_prompt(prompt.text),
                api_key_id=given.api_key_id,
            )
        Message.objects.create(conversation=conversation, role=Message.Role.USER, text=prompt.text)
        assistant = Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            request_id=prompt.request_id,
            instance=settings.CHAT_INSTANCE,
            policy_id=policy.id,
            policy_version=policy.version if policy.id else None,
            identity=identity or "",
            overrides=given.override.to_json() if given.override is not None else "",
        )
    return Prepared(
        conversation, assistant, policy, messages, rendered, request, identity, prompt.text
    )


def supersede(conversation: Conversation, prompt: Prompt) -> str:
    """Mark the last prompt and its answer `prompt.replace` as earlier versions; their prompt text."""
    answer = (
        conversation.messages.filter(role=Message.Role.ASSISTANT, superseded=False)
        .select_for_update()
        .last()
    )
    if answer is None or answer.pk != prompt.replace or answer.status == Message.Status.STREAMING:
        raise TurnError(
            "bad_message",
            "replace must name the conversation's last answer, once it has finished",
        )
    asked = conversation.messages.filter(
        role=Message.Role.USER, superseded=False, id__lt=answer.pk
    ).last()
    conversation.messages.filter(pk__in=[answer.pk, asked.pk if asked else answer.pk]).update(
        superseded=True
    )
    return asked.text if asked else ""
