# Reserved for parallel work; its owner fills in the operations.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0010_log_path"),
    ]

    operations = []  # type: ignore[var-annotated]
