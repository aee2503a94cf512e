from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("chat", "0018_oidc_identity")]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="expires_at",
            field=models.DateTimeField(
                blank=True, help_text="refused from this moment on; empty: never expires", null=True
            ),
        ),
    ]
