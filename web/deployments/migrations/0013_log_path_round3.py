# Reserved for issue 22's third round (filled by its owner, or removed if unused).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("deployments", "0012_status_read")]

    operations = []  # type: ignore[var-annotated]
