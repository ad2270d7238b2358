# Reserved for parallel work; its owner fills in the operations.
# The model store's load-time side: each root's measured read rate, and each
# deployment's expected weight load.
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0010_log_path"),
    ]

    operations = [
        migrations.CreateModel(
            name="RootReadRate",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("root", models.CharField(max_length=500, unique=True)),
                ("gbps", models.FloatField()),
                ("bytes_read", models.BigIntegerField()),
                ("seconds", models.FloatField()),
                ("method", models.CharField(max_length=20)),
                ("note", models.TextField(blank=True, default="")),
                ("measured_at", models.DateTimeField()),
            ],
        ),
        migrations.AddField(
            model_name="deployment",
            name="load_estimate",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
