from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("chat", "0023_user_settings")]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="pinned",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="conversation",
            name="archived_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
