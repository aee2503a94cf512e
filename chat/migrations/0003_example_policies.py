"""The two policies docs/policies.md describes: `chat` (default, streamed) and `json` (buffered, with a schema)."""

from django.db import migrations

CHAT = {
    "name": "Chat",
    "slug": "chat",
    "is_default": True,
    "mode": "stream",
    "moderation_hooks": [{"hook": "repetition", "settings": {"max_chars": 6000, "max_repeats": 4}}],
    "blocklist_terms": "",
    "max_new_tokens": 256,
    "stop_strings": ["\nUser:"],
    "cache_enabled": True,
}

JSON = {
    "name": "JSON answer",
    "slug": "json",
    "is_default": False,
    "mode": "buffer",
    "json_schema": {
        "type": "object",
        "properties": {"answer": {"type": "string", "minLength": 1}},
        "required": ["answer"],
    },
    "moderation_hooks": [],
    # Measured by `manage.py jsonpassrate` (20 prompts, greedy): instruction only 0/20,
    # with the example 19/20, constrained 16/20, constrained with the example 20/20.
    "constrained": True,
    "system_prompt": 'Reply only with JSON like {"answer": "..."}.',
    # SmolLM2-135M ignores a JSON instruction alone; one worked example makes it follow.
    "examples": [{"user": "What color is the sky?", "assistant": '{"answer": "blue"}'}],
    "max_new_tokens": 128,
    "max_retries": 2,
    "failure_action": "reject",
    "cache_enabled": True,
}


def create(apps, schema_editor):
    OutputPolicy = apps.get_model("chat", "OutputPolicy")
    PolicyRevision = apps.get_model("chat", "PolicyRevision")
    for fields in (CHAT, JSON):
        policy, created = OutputPolicy.objects.get_or_create(slug=fields["slug"], defaults=fields)
        if created:
            PolicyRevision.objects.create(
                policy=policy,
                version=1,
                changes={"created": [None, "by migration"]},
                snapshot=fields,
            )


def remove(apps, schema_editor):
    apps.get_model("chat", "OutputPolicy").objects.filter(slug__in=["chat", "json"]).delete()


class Migration(migrations.Migration):
    dependencies = [("chat", "0002_output_policies")]
    operations = [migrations.RunPython(create, remove)]
