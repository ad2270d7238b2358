"""The hosts' reports live in fleet.FleetHost (fleet 0004 and 0005 copied every row there):
the Host model and its table go."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0017_gpulease_to_fleet"),
        ("fleet", "0005_host_reports_copy"),
    ]

    operations = [
        migrations.DeleteModel(name="Host"),
    ]
