"""Reserved for a change in progress; its operations are filled in by that change."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("deployments", "0005_metrics")]

    operations = []  # type: ignore[var-annotated]
