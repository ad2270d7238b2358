"""Lifecycle: runs of a deployment (deploy, Restart, the restart policy) and the policy's count."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("deployments", "0006_gpu_leases")]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="restart_not_before",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="deployment",
            name="restarts",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="deployment",
            name="run",
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("number", models.PositiveIntegerField()),
                ("reason", models.CharField(choices=[("deploy", "Deploy"), ("restart", "Restart"),
                                                     ("policy", "Policy")], max_length=16)),
                ("first_seq", models.PositiveBigIntegerField()),
                ("started_at", models.DateTimeField()),
                ("outcome", models.CharField(blank=True, default="", max_length=16)),
                ("diagnosis", models.JSONField(blank=True, null=True)),
                ("deployment", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                                 related_name="runs",
                                                 to="deployments.deployment")),
                ("started_by", models.ForeignKey(blank=True, null=True,
                                                 on_delete=django.db.models.deletion.SET_NULL,
                                                 to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "ordering": ["deployment", "number"],
                "constraints": [models.UniqueConstraint(fields=("deployment", "number"),
                                                        name="run_number_unique")],
            },
        ),
    ]
