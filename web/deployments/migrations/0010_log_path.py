# Reserved for parallel work; its owner fills in the operations.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0009_status_summary"),
    ]

    operations = []  # type: ignore[var-annotated]
