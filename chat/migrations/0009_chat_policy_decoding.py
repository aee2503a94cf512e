"""The shipped `chat` policy gets the decoding defaults measured with `manage.py answerquality`
(docs/decoding.md): repetition penalty 1.1 and room for 768 new tokens. A policy staff have
already changed is left as it is."""

from django.db import migrations

SHIPPED = {"repetition_penalty": 1.0, "max_new_tokens": 256}
MEASURED = {"repetition_penalty": 1.1, "max_new_tokens": 768}


def _move(apps, before: dict, after: dict, note: str) -> None:
    OutputPolicy = apps.get_model("chat", "OutputPolicy")
    PolicyRevision = apps.get_model("chat", "PolicyRevision")
    policy = OutputPolicy.objects.filter(slug="chat", **before).first()
    if policy is None:
        return
    for name, value in after.items():
        setattr(policy, name, value)
    policy.version += 1  # part of every cache key: answers made before are not served again
    policy.save()
    changes = {name: [before[name], after[name]] for name in after}
    changes["note"] = [None, note]
    latest = PolicyRevision.objects.filter(policy=policy).order_by("-version").first()
    snapshot = dict(latest.snapshot or {}) if latest else {}
    snapshot.update(after)
    PolicyRevision.objects.create(
        policy=policy, version=policy.version, changes=changes, snapshot=snapshot
    )


def forward(apps, schema_editor):
    _move(apps, SHIPPED, MEASURED, "by migration: decoding defaults measured on the prompt set")


def backward(apps, schema_editor):
    _move(apps, MEASURED, SHIPPED, "by migration: back to the earlier defaults")


class Migration(migrations.Migration):
    dependencies = [("chat", "0008_decoding_penalties")]
    operations = [migrations.RunPython(forward, backward)]
