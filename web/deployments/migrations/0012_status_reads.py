# Status reads: the detail and summary JSON stored by the row's writers
# (StatusBody; web/deployments/services/reads.py).
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0011_model_store"),
    ]

    operations = [
        migrations.CreateModel(
            name="StatusBody",
            fields=[
                ("deployment", models.OneToOneField(
                    on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                    related_name="+", serialize=False, to="deployments.deployment")),
                ("version", models.CharField(max_length=20)),
                ("detail", models.BinaryField()),
                ("summary", models.BinaryField()),
            ],
        ),
    ]
