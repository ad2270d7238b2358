"""GpuLease leaves this app's migrations' state; the table `deployments_gpulease` and its
rows stay as they are (no SQL): fleet's 0003_gpulease, which runs before this one, holds the
same model on the same table."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [("deployments", "0016_tune_hold")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="GpuLease")],
            database_operations=[],
        ),
    ]
