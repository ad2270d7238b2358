"""Benchmark failures: the count of failed requests per run (a run where every request
failed ends `failed` with the first error in `error`)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("benchmarks", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="benchmarkrun",
            name="failed_requests",
            field=models.PositiveIntegerField(default=0),
        ),
    ]
