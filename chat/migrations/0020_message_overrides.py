from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("chat", "0019_apikey_expiry")]

    operations = [
        migrations.AddField(
            model_name="message",
            name="overrides",
            field=models.TextField(
                blank=True,
                help_text="the request's own settings over its policy's (an OpenAI-compatible "
                "API request's stop, max_tokens, tools, system prompt...), as "
                "PolicyOverride.to_json wrote them, for a Continue to apply again; empty when it "
                "had none",
            ),
        ),
    ]
