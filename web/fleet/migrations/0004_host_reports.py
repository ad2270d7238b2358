"""FleetHost gains the report columns deployments.Host held: the agent's id, the NVML
snapshot, the engine secret store's names and the strays (0005 copies the rows)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0003_gpulease"),
    ]

    operations = [
        migrations.AddField(
            model_name="fleethost",
            name="agent_id",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.AddField(
            model_name="fleethost",
            name="foreign_containers",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="fleethost",
            name="gpu_telemetry",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="fleethost",
            name="secret_names",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
