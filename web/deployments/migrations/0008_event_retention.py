"""The detail page's log: a partial index that finds the rare event kinds among the lines
(docs/events-retention.md)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("deployments", "0007_lifecycle")]

    operations = [
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("kind__in", ["alert", "build", "diagnosis", "end", "phase",
                                                 "preflight", "selfcheck", "status"])),
                fields=["deployment", "seq"], name="event_notable"),
        ),
    ]
