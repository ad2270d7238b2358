from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('deployments', '0015_rolling'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='tune_hold',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
