"""Preparing a new prompt's turn (sync, in a worker thread): its policy, conversation, stored
messages, the prompt fitted to the model, and the answer's identity. A Continue is
chat/turns/continuation.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import transaction

from ..engine.sampling_params import SamplingChanges
from ..engine.types import Backend, EngineError, GenerationRequest
from ..infra.engines import EngineSpec
from ..models import Conversation, Feedback, Message, OutputPolicy
from ..protocol import Prompt
from ..stores import feedback, policy_store, user_settings
from ..stores.branches import Tree, branch_show, message_add
from ..stores.selectors import Owner, branch_history, conversations_for
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
    sampling: SamplingChanges | None = None  # built at the transport's edge, merged here
    api_key_id: int | None = None

    @property
    def client_context(self) -> bool:
        """The model reads something only the client holds (earlier turns, tool results among
        them, or its own system prompt): the answer is never shared. A request's tools and
        schema are parameters, part of the identity, not context."""
        return bool(self.history) or (
            self.override is not None and self.override.system_prompt is not None
        )


# Of the model's context, what a new prompt may not take by default: the longest answer, and
# room for the policy's system prompt and examples and the latest turns.
CONTEXT_KEPT_FOR_THE_REST = 1024


def prompt_token_limit(backend: Backend) -> int:
    """The longest new prompt in tokens (0: none but the context): CHAT_LIMITS' prompt_tokens,
    or by default what the model's context leaves after the answer's room (about 6,000 tokens
    of the bundled model's 8,192), so a pasted document fits."""
    if settings.CHAT_MAX_PROMPT_TOKENS is not None:
        return settings.CHAT_MAX_PROMPT_TOKENS
    room = settings.CHAT_MAX_NEW_TOKENS_CAP + CONTEXT_KEPT_FOR_THE_REST
    return max(backend.context_length - room, backend.context_length // 2)


def own_settings(given: Given) -> bool:
    """Whether the user's own settings (custom instructions, default policy) apply: on the page
    and /api, not on /v1, whose request brings its own system prompt and names its model."""
    return given.api_key_id is None


def check_prompt_tokens(backend: Backend, text: str) -> None:
    """A per-prompt limit in the model's tokens; characters alone let odd text cost many tokens each."""
    limit = prompt_token_limit(backend)
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
    policy: policy_store.ResolvedPolicy,
    override: policy_store.PolicyOverride | None,
    sampling: SamplingChanges | None,
) -> policy_store.ResolvedPolicy:
    """`policy` with one request's settings applied (a new prompt's, or again a Continue's):
    the policy's own changes, then the request's decoding settings merged with the policy's."""
    if override is not None:
        try:
            policy = override.apply(policy)
        except policy_store.ToolsRefused as exc:
            raise TurnError(exc.code, str(exc)) from None
    changes = (
        sampling.changes_to(policy.sampling, max_new_tokens_cap=settings.CHAT_MAX_NEW_TOKENS_CAP)
        if sampling is not None
        else {}
    )
    if not changes:
        return policy
    recorded = {k: list(v) if isinstance(v, tuple) else v for k, v in changes.items()}
    return replace(
        policy,
        sampling=policy.sampling.with_changes(**changes),
        overrides={**policy.overrides, **recorded},
    )


def settings_text(
    override: policy_store.PolicyOverride | None, sampling: SamplingChanges | None
) -> str:
    """One request's own settings as JSON text ("" for none), kept with the answer it made so a
    Continue applies them again (`settings_of`). Text rather than a JSON column's value: a
    schema's and a tool's parameters keep their key order, which orders the grammar and the
    prompt."""
    if override is None and sampling is None:
        return ""
    given = (override or policy_store.PolicyOverride()).as_dict()
    return json.dumps(
        given | (sampling or SamplingChanges()).as_dict(), ensure_ascii=False, separators=(",", ":")
    )


def settings_of(text: str) -> tuple[policy_store.PolicyOverride, SamplingChanges]:
    """The settings `settings_text` wrote."""
    data = json.loads(text)
    return policy_store.PolicyOverride.from_dict(data), SamplingChanges.from_dict(data)


def prepare_prompt(
    owner: Owner,
    prompt: Prompt,
    backend: Backend,
    given: Given,
    engine: EngineSpec | None = None,
    routed: OutputPolicy | None = None,
) -> Prepared:
    """Resolve the policy, store the prompt and its streaming answer, fit the prompt to the model
    (`backend`, of `engine`: None is the default engine). `routed` is the policy's row as the
    route read it (engine_routes.py), so it is not read twice."""
    check_prompt_tokens(backend, prompt.text)
    own = own_settings(given)
    try:
        if routed is not None:
            policy = policy_store.resolve(routed)
        elif own:
            policy = user_settings.policy_for(owner, prompt.policy)
        else:
            policy = policy_store.policy_for(prompt.policy)
    except policy_store.UnknownPolicy as exc:
        raise TurnError(exc.code, str(exc)) from None
    policy = overridden(policy, given.override, given.sampling)
    conversation = None
    if prompt.conversation is not None:
        conversation = conversations_for(owner).filter(pk=prompt.conversation).first()
        if conversation is None:
            raise TurnError(
                "unknown_conversation", f"conversation {prompt.conversation} does not exist"
            )
    with transaction.atomic():
        # Where the new messages go: after the branch shown, or beside a version (a fork).
        fork = (
            fork_at(conversation, prompt)
            if conversation is not None and prompt.replace is not None
            else None
        )
        regenerate = fork is not None and fork.text == prompt.text
        if regenerate:  # soon after a cache hit, the hit was not what the user wanted
            feedback.implicit_signal(
                owner=owner, message_id=prompt.replace, kind=Feedback.Kind.REGENERATED
            )
        tree = Tree.of(conversation) if conversation is not None else None
        after = tree.leaf() if tree is not None else None
        if tree is not None and fork is not None:
            # The new version's branch is shown, wherever the version it joins was.
            branch_show(tree, fork)
            # Edit: a version of the prompt, under its parent; Regenerate asks it after the same.
            after = tree.by_id.get(fork.parent_id) if fork.parent_id else None
        history = given.history
        if history is None:
            history = [] if tree is None else branch_history(tree, upto=after.pk if after else None)
        try:
            messages, rendered, input_ids = fit_prompt(
                backend,
                policy,
                history,
                prompt.text,
                instructions=user_settings.instructions_for(owner) if own else "",
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
        new_conversation = conversation is None
        if new_conversation:
            conversation = Conversation.objects.create(
                user_id=owner.user_id,
                session_key="" if owner.user_id is not None else owner.session_key,
                title=Conversation.title_from_prompt(prompt.text),
                api_key_id=given.api_key_id,
            )
        if regenerate:
            asked = fork  # a new version of the answer, to the same prompt
        else:
            asked = message_add(
                conversation,
                after,
                only_child=new_conversation,
                role=Message.Role.USER,
                text=prompt.text,
            )
        assistant = message_add(
            conversation,
            asked,
            only_child=not regenerate,  # `asked` was stored just now
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            request_id=prompt.request_id,
            instance=settings.CHAT_INSTANCE,
            policy_id=policy.id,
            policy_version=policy.version if policy.id else None,
            identity=identity or "",
            overrides=settings_text(given.override, given.sampling),
        )
    return Prepared(
        conversation, assistant, policy, messages, rendered, request, identity, prompt.text
    )


def fork_at(conversation: Conversation, prompt: Prompt) -> Message:
    """The prompt of the answer `prompt.replace` names, any finished answer of the conversation:
    a new version goes beside it (Edit: other text) or beside that answer (Regenerate)."""
    answer = (
        conversation.messages.filter(pk=prompt.replace, role=Message.Role.ASSISTANT)
        .select_for_update()
        .first()
    )
    asked = answer.parent if answer is not None else None
    if answer is None or answer.status == Message.Status.STREAMING or asked is None:
        raise TurnError(
            "bad_message",
            "replace must name an answer of this conversation, once it has finished",
        )
    return asked
