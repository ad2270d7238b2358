# The status summary's derived parts on the deployment row, kept by their writers.
from typing import Any

from django.db import migrations, models

from appliance.runtime import series


def backfill(apps: Any, schema_editor: Any) -> None:
    """What the writers would have kept: the spec's graph widths, each alert's latest raise
    and clear, the newest metric point."""
    from web.deployments.selectors import (
        ALERT_EVENTS,
        alerts_as_stored,
        alerts_fold,
        spec_graph_widths,
    )

    deployment_model = apps.get_model("deployments", "Deployment")
    event_model = apps.get_model("deployments", "Event")
    point_model = apps.get_model("deployments", "MetricPoint")
    for d in deployment_model.objects.only("pk", "spec").iterator():
        alerts = event_model.objects.filter(deployment_id=d.pk, kind="alert").order_by("-seq")
        history = alerts_fold(events=((e.payload, e.ts) for e in alerts[:ALERT_EVENTS]))
        point = point_model.objects.filter(deployment_id=d.pk).order_by("-ts").first()
        latest = None if point is None else series.MetricPoint(
            t=point.ts.timestamp(), gpus=point.gpus or [],
            **{name: getattr(point, name) for name in series.SCALARS}).to_dict()
        deployment_model.objects.filter(pk=d.pk).update(
            graph_needed=spec_graph_widths(spec=d.spec), latest_metrics=latest,
            alert_history=alerts_as_stored(history=history))


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0008_event_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="alert_history",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="deployment",
            name="graph_needed",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="deployment",
            name="latest_metrics",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
