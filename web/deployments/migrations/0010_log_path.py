# The events table without its foreign key check and its redundant deployment
# index (models.Event.deployment says why and what keeps the integrity).
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0009_status_summary"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="deployment",
            field=models.ForeignKey(
                db_constraint=False, db_index=False,
                on_delete=django.db.models.deletion.CASCADE, related_name="events",
                to="deployments.deployment"),
        ),
    ]
