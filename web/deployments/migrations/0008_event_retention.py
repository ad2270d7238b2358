"""The detail page's log: a partial index that finds the rare event kinds among the lines,
and where the retention's last pass by age ended (docs/events-retention.md)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("deployments", "0007_lifecycle")]

    operations = [
        migrations.AddField(
            model_name="deployment", name="log_pruned_seq",
            field=models.PositiveBigIntegerField(default=0)),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("kind__in", ["alert", "build", "diagnosis", "end", "phase",
                                                 "preflight", "selfcheck", "status"])),
                fields=["deployment", "seq"], name="event_notable"),
        ),
    ]
