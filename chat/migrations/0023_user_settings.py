import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0022_message_branches"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ChatSettings",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "instructions",
                    models.TextField(
                        blank=True,
                        help_text="a note the model reads before every new turn of this user's chats (the page and /api, not /v1)",
                        max_length=1500,
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "default_policy",
                    models.ForeignKey(
                        blank=True,
                        help_text="the policy a new chat starts with; empty: the site's default",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="chat.outputpolicy",
                    ),
                ),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="chat_settings",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name": "chat settings",
                "verbose_name_plural": "chat settings",
            },
        ),
    ]
