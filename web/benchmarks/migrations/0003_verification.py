# Reserved for parallel work; its owner fills in the operations.
# The losslessness check's run (web/benchmarks/verification_models.py). Deployments and the
# user model come in through 0001's dependencies.
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("benchmarks", "0002_failure"),
    ]

    operations = [
        migrations.CreateModel(
            name="VerificationRun",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("name", models.CharField(blank=True, default="", max_length=100)),
                ("status", models.CharField(choices=[
                    ("queued", "Queued"), ("running", "Running"), ("cancelling", "Cancelling"),
                    ("cancelled", "Cancelled"), ("done", "Done"), ("failed", "Failed")],
                    db_index=True, default="queued", max_length=16)),
                ("config", models.JSONField(default=dict)),
                ("prompts_text", models.TextField(blank=True, default="")),
                ("targets", models.JSONField(default=dict)),
                ("progress", models.JSONField(blank=True, default=dict)),
                ("results", models.JSONField(blank=True, default=dict)),
                ("error", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("baseline", models.ForeignKey(
                    blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                    related_name="+", to="deployments.deployment")),
                ("candidate", models.ForeignKey(
                    blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                    related_name="+", to="deployments.deployment")),
                ("created_by", models.ForeignKey(
                    blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                    related_name="+", to=settings.AUTH_USER_MODEL)),
            ],
            options={"ordering": ["-created_at"]},
        ),
    ]
