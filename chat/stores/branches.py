"""A conversation as a tree of messages, and the branch it shows.

Each message's parent is the one before it on its branch (an answer's prompt; a prompt's earlier
answer, or none for a first prompt). Messages with the same parent are versions of one another:
Regenerate adds an answer beside an answer, Edit a prompt beside a prompt. In each set of
siblings one is `selected`; from the first prompts down, the selected ones are the thread the
page, `/api`, the export and the model's history all read. Switching versions selects another
sibling, and below it the versions selected there before show again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from ..models import Conversation, Message
from ..models.conversations import shown_path


class Busy(Exception):
    """The conversation has an answer being written: its branch must not change under it."""


class UnknownMessage(LookupError):
    """No such message in that conversation."""


@dataclass
class Tree:
    """A conversation's messages, read at once (a conversation is small), and their links."""

    messages: list[Message]
    children: dict[int | None, list[Message]] = field(default_factory=dict)
    by_id: dict[int, Message] = field(default_factory=dict)

    @classmethod
    def of(cls, conversation: Conversation | int) -> Tree:
        conversation_id = conversation if isinstance(conversation, int) else conversation.pk
        rows = list(
            Message.objects.filter(conversation_id=conversation_id).order_by("created_at", "id")
        )
        return cls.built(rows)

    @classmethod
    def built(cls, messages: list[Message]) -> Tree:
        """The tree of `messages` (one conversation's, oldest first)."""
        tree = cls(messages)
        for message in messages:
            tree.by_id[message.pk] = message
            tree.children.setdefault(message.parent_id, []).append(message)
        return tree

    def siblings(self, message: Message) -> list[Message]:
        """`message` and its other versions, oldest first."""
        return self.children.get(message.parent_id, [message])

    def path(self) -> list[Message]:
        """The branch shown: from the first prompt, the selected child each time down."""
        return shown_path(self.messages)

    def leaf(self) -> Message | None:
        """The last message of the branch shown, which a new prompt follows."""
        path = self.path()
        return path[-1] if path else None

    def path_to(self, message_id: int | None) -> list[Message]:
        """The branch that ends at `message_id`, from its first prompt (none for None)."""
        line: list[Message] = []
        message = self.by_id.get(message_id) if message_id is not None else None
        while message is not None:
            line.append(message)
            message = self.by_id.get(message.parent_id) if message.parent_id else None
        return line[::-1]


def message_add(
    conversation: Conversation, parent: Message | None, *, only_child: bool = False, **fields
) -> Message:
    """Store a message under `parent` as the selected version of its siblings (call inside a
    transaction): a new message is what its branch shows from now on. `only_child`: the caller
    stored `parent` (or the conversation) in this transaction, so there is no sibling to hide."""
    if not only_child:
        Message.objects.filter(conversation=conversation, parent=parent).update(selected=False)
    message = Message(conversation=conversation, parent=parent, selected=True, **fields)
    message.save(force_insert=True, first=parent is None)
    return message


def branch_show(tree: Tree, message: Message) -> None:
    """Make `message`'s branch the one shown: it and every message above it become the selected
    version among their siblings (call inside a transaction)."""
    for line in tree.path_to(message.pk):
        others = [m.pk for m in tree.siblings(line) if m.pk != line.pk and m.selected]
        if line.selected and not others:
            continue
        Message.objects.filter(pk__in=others).update(selected=False)
        Message.objects.filter(pk=line.pk).update(selected=True)
        for sibling in tree.siblings(line):
            sibling.selected = sibling.pk == line.pk


def version_select(conversations, conversation_id: int, message_id: int) -> Message | None:
    """Show `message_id` in its conversation (one of `conversations`, the owner's), in place of
    its siblings; below it, what was selected there before. None if the conversation is not
    there; UnknownMessage if the message is not in it; Busy while an answer of the
    conversation is being written."""
    with transaction.atomic():
        conversation = conversations.select_for_update().filter(pk=conversation_id).first()
        if conversation is None:
            return None
        tree = Tree.of(conversation)
        message = tree.by_id.get(message_id)
        if message is None:
            raise UnknownMessage(f"conversation {conversation_id} has no message {message_id}")
        if any(m.status == Message.Status.STREAMING for m in tree.messages):
            raise Busy("an answer is being written in this conversation; switch when it ends")
        branch_show(tree, message)
    return message
