from django.db import migrations, models


def caching_only_reproducible(apps, schema_editor):
    """A policy that samples without a seed can no longer cache: its answers are never the same."""
    OutputPolicy = apps.get_model("chat", "OutputPolicy")
    OutputPolicy.objects.filter(temperature__gt=0, cache_enabled=True).update(cache_enabled=False)


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0012_policy_regressions"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="identity",
            field=models.CharField(
                blank=True,
                db_index=True,
                help_text="what made the answer, hashed (docs/policies.md, what makes two answers the same); empty when it is never shared: sampled without a seed, or a context the server does not hold",
                max_length=64,
            ),
        ),
        migrations.AddField(
            model_name="outputpolicy",
            name="seed",
            field=models.BigIntegerField(
                blank=True,
                help_text="with temperature above 0, makes sampling reproducible, so its answers may be cached; empty: every sampled answer is new and never cached",
                null=True,
            ),
        ),
        migrations.RunPython(caching_only_reproducible, migrations.RunPython.noop),
    ]
