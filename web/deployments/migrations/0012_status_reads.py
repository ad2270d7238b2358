# Reserved for parallel work (issue 22, status reads); its owner fills in the operations.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0011_model_store"),
    ]

    operations: list[migrations.operations.base.Operation] = []
