"""GPU leases (a row per host and GPU, unique while held) and the agents' secret names.

Deployments already active when this runs take their GPUs oldest first; a GPU an older
one holds already is left to it (an install from before leases may have double-booked).
"""

from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

ACTIVE = ["queued", "building", "starting", "checking", "loading", "capturing", "ready",
          "stopping"]


def lease_active_deployments(apps: Any, schema_editor: Any) -> None:
    deployment_model = apps.get_model("deployments", "Deployment")
    lease_model = apps.get_model("deployments", "GpuLease")
    taken: set[int] = set()
    for deployment in deployment_model.objects.filter(status__in=ACTIVE).order_by("created_at", "id"):
        gpus = [g for g in deployment.gpus or [] if isinstance(g, int) and g not in taken]
        taken.update(gpus)
        lease_model.objects.bulk_create([lease_model(host=settings.HOST_NAME, gpu_index=g,
                                                     deployment=deployment) for g in gpus])


class Migration(migrations.Migration):
    dependencies = [("deployments", "0005_metrics")]

    operations = [
        migrations.AddField(
            model_name="host",
            name="secret_names",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.CreateModel(
            name="GpuLease",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("host", models.CharField(max_length=100)),
                ("gpu_index", models.PositiveSmallIntegerField()),
                ("acquired_at", models.DateTimeField(auto_now_add=True)),
                ("deployment", models.ForeignKey(
                    on_delete=django.db.models.deletion.CASCADE, related_name="gpu_leases",
                    to="deployments.deployment")),
            ],
            options={
                "ordering": ["host", "gpu_index"],
                "constraints": [models.UniqueConstraint(fields=("host", "gpu_index"),
                                                        name="gpulease_host_gpu_unique")],
            },
        ),
        migrations.RunPython(lease_active_deployments, migrations.RunPython.noop),
    ]
