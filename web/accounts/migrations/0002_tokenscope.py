import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_hash_plain_tokens"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    operations = [
        migrations.CreateModel(
            name="TokenScope",
            fields=[
                ("token", models.OneToOneField(
                    on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                    related_name="scope", serialize=False, to="knox.authtoken")),
                ("role", models.CharField(
                    choices=[("viewer", "Viewer"), ("operator", "Operator")], max_length=16)),
            ],
        ),
    ]
