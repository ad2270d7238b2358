from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('deployments', '0014_placement'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='rolling',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
