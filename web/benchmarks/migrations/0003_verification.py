# Reserved for parallel work; its owner fills in the operations.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("benchmarks", "0002_failure"),
    ]

    operations = []  # type: ignore[var-annotated]
