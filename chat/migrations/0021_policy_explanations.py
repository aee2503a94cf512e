from django.db import migrations, models

# The shipped policies (0003) say what they are for; one staff already described is left alone.
DESCRIPTIONS = {
    "chat": "Everyday answers, shown as they are written.",
    "json": 'An answer as a JSON object with an "answer" field, for programs that read it.',
}


def describe_shipped(apps, schema_editor):
    OutputPolicy = apps.get_model("chat", "OutputPolicy")
    for slug, description in DESCRIPTIONS.items():
        OutputPolicy.objects.filter(slug=slug, description="").update(description=description)


class Migration(migrations.Migration):
    dependencies = [("chat", "0020_message_overrides")]

    operations = [
        migrations.AddField(
            model_name="outputpolicy",
            name="description",
            field=models.CharField(
                blank=True,
                help_text="what the policy is for, in a sentence users read: the chat's policy "
                "picker shows it, and an answer that fails the policy quotes it",
                max_length=200,
            ),
        ),
        migrations.AddField(
            model_name="outputpolicy",
            name="show_failed_text",
            field=models.BooleanField(
                default=True,
                help_text="an answer that stays invalid shows the user what the model wrote, "
                "beside why it failed; a withdrawn (moderated) answer's text is never shown",
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="explanation",
            field=models.JSONField(
                blank=True,
                help_text="why an invalid or withdrawn answer failed, as its `done` told the user",
                null=True,
            ),
        ),
        migrations.RunPython(describe_shipped, migrations.RunPython.noop),
    ]
