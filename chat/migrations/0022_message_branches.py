"""Conversations become trees of messages: each message gets its parent, and the versions that
Regenerate and Edit used to mark `superseded` become siblings of what replaced them.

Before, a conversation was one list in the order it was written: Regenerate and Edit could only
replace the last exchange, and marked the replaced prompt and answer `superseded`. So a prompt's
parent is the last answer before it that was not superseded, and an answer's is the prompt just
before it. Regenerate stored the prompt again, word for word, at the same place: such a copy is
folded into the first prompt with that text there, its answers moving under it, so the old and
the new answer are versions of one answer. What was not superseded is the selected path.
"""

from django.db import migrations, models


def _messages(Message, conversation_id):
    return list(Message.objects.filter(conversation_id=conversation_id).order_by("created_at", "id"))


def _link(messages) -> tuple[dict, set]:
    """(message id -> parent id, ids of the messages that were current), in the old list order."""
    parents, current = {}, set()
    tip = asked = None
    for message in messages:
        if message.role == "user":
            parents[message.pk] = tip
            asked = message.pk
        else:
            parents[message.pk] = asked
            if not message.superseded:
                tip = message.pk
        if not message.superseded:
            current.add(message.pk)
    return parents, current


def _fold_copies(messages, parents, current) -> list:
    """Regenerate's copies of a prompt folded into the first: (copy, kept) pairs."""
    first_at: dict = {}
    folded = []
    for message in messages:
        if message.role != "user":
            continue
        place = (parents[message.pk], message.text)
        kept = first_at.setdefault(place, message.pk)
        if kept != message.pk:
            folded.append((message.pk, kept))
            if message.pk in current:
                current.add(kept)
    for copy, kept in folded:
        for child, parent in parents.items():
            if parent == copy:
                parents[child] = kept
        del parents[copy]
    return folded


def _selection(messages, parents, current) -> set:
    """In each set of siblings, the last one that was current, else the last one."""
    groups: dict = {}
    for message in messages:
        if message.pk in parents:
            groups.setdefault(parents[message.pk], []).append(message.pk)
    selected = set()
    for ids in groups.values():
        shown = [pk for pk in ids if pk in current]
        selected.add((shown or ids)[-1])
    return selected


def to_branches(apps, schema_editor):
    Message = apps.get_model("chat", "Message")
    conversation_ids = Message.objects.values_list("conversation_id", flat=True).distinct()
    for conversation_id in list(conversation_ids):
        messages = _messages(Message, conversation_id)
        parents, current = _link(messages)
        folded = _fold_copies(messages, parents, current)
        selected = _selection(messages, parents, current)
        for message in messages:
            if message.pk not in parents:
                continue
            message.parent_id = parents[message.pk]
            message.selected = message.pk in selected
        # Parents first: a prompt's parent exists before the prompt points at it.
        Message.objects.bulk_update(
            [m for m in messages if m.pk in parents], ["parent", "selected"], batch_size=500
        )
        Message.objects.filter(pk__in=[copy for copy, _ in folded]).delete()
    if schema_editor.connection.vendor == "postgresql":
        # The new foreign keys are checked at commit; checked now, or PostgreSQL refuses the
        # ALTER TABLE that drops `superseded` ("pending trigger events").
        schema_editor.connection.check_constraints()


def to_superseded(apps, schema_editor):
    """Back to one list: everything off the selected path is superseded (a folded copy of a
    prompt is not made again; its answers stay under the prompt they were folded into)."""
    Message = apps.get_model("chat", "Message")
    conversation_ids = Message.objects.values_list("conversation_id", flat=True).distinct()
    for conversation_id in list(conversation_ids):
        messages = _messages(Message, conversation_id)
        children: dict = {}
        for message in messages:
            children.setdefault(message.parent_id, []).append(message)
        shown, parent = set(), None
        while children.get(parent):
            group = children[parent]
            chosen = [m for m in group if m.selected] or group
            parent = chosen[-1].pk
            shown.add(parent)
        Message.objects.filter(conversation_id=conversation_id).exclude(pk__in=shown).update(
            superseded=True
        )


class Migration(migrations.Migration):
    dependencies = [("chat", "0021_policy_explanations")]

    operations = [
        migrations.AddField(
            model_name="message",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                help_text="the message before it on its branch (an answer's prompt, a prompt's "
                "earlier answer); null for a first prompt. Messages with the same parent are "
                "versions of one another",
                null=True,
                on_delete=models.deletion.CASCADE,
                related_name="children",
                to="chat.message",
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="selected",
            field=models.BooleanField(
                default=True,
                help_text="the version among its siblings that the conversation shows (the "
                "newest, until the user switches)",
            ),
        ),
        migrations.RunPython(to_branches, to_superseded),
        migrations.RemoveField(model_name="message", name="superseded"),
    ]
