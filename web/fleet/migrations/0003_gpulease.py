"""GpuLease comes to the fleet app in the migrations' state only: the table stays
`deployments_gpulease`, with its rows, its unique constraint and its foreign key, untouched
(no SQL). deployments' 0017_gpulease_to_fleet, which runs after this one (run_before),
drops the model from that app's state, also without SQL, so the model is in one app's
state at every step and the table never leaves the database."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0002_agent_lease"),
        ("deployments", "0016_tune_hold"),
    ]
    run_before = [("deployments", "0017_gpulease_to_fleet")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="GpuLease",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                                   serialize=False, verbose_name="ID")),
                        ("host", models.CharField(max_length=100)),
                        ("gpu_index", models.PositiveSmallIntegerField()),
                        ("acquired_at", models.DateTimeField(auto_now_add=True)),
                        ("deployment", models.ForeignKey(
                            on_delete=django.db.models.deletion.CASCADE,
                            related_name="gpu_leases", to="deployments.deployment")),
                    ],
                    options={
                        "db_table": "deployments_gpulease",
                        "ordering": ["host", "gpu_index"],
                        "constraints": [models.UniqueConstraint(
                            fields=("host", "gpu_index"), name="gpulease_host_gpu_unique")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
