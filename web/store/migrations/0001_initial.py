# The model store: entries per model folder in a root, one row per file.
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='ModelEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('root', models.CharField(help_text='The model root as this host sees it.', max_length=500)),
                ('relative_path', models.CharField(help_text='The model folder below the root; engines see /models/<relative_path>.', max_length=500)),
                ('source', models.CharField(choices=[('hub', 'Hub'), ('local', 'Local')], default='local', max_length=8)),
                ('repo_id', models.CharField(blank=True, default='', max_length=200)),
                ('revision', models.CharField(blank=True, default='', help_text='The revision asked for (branch, tag or commit).', max_length=200)),
                ('commit', models.CharField(blank=True, default='', help_text='The commit the revision resolved to.', max_length=64)),
                ('size_bytes', models.BigIntegerField(default=0)),
                ('bytes_done', models.BigIntegerField(default=0)),
                ('file_count', models.IntegerField(default=0)),
                ('kind', models.CharField(choices=[('target', 'Target'), ('drafter', 'Drafter')], default='target', max_length=8)),
                ('config', models.JSONField(blank=True, default=dict, help_text='Key config.json values (appliance.store.config).')),
                ('state', models.CharField(choices=[('downloading', 'Downloading'), ('verifying', 'Verifying'), ('ready', 'Ready'), ('partial', 'Partial'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='downloading', max_length=12)),
                ('error', models.TextField(blank=True, default='')),
                ('rate_bps', models.FloatField(default=0.0)),
                ('cancel_requested', models.BooleanField(default=False)),
                ('lease_owner', models.CharField(blank=True, default='', max_length=100)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('verified_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['relative_path', 'root'],
                'constraints': [models.UniqueConstraint(fields=('root', 'relative_path'), name='store_entry_unique_folder')],
            },
        ),
        migrations.CreateModel(
            name='ModelFile',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('path', models.CharField(help_text="Below the entry's folder.", max_length=500)),
                ('size_bytes', models.BigIntegerField(default=0)),
                ('sha256_expected', models.CharField(blank=True, default='', help_text="The hub's LFS sha256 (none for small files).", max_length=64)),
                ('sha256_actual', models.CharField(blank=True, default='', max_length=64)),
                ('bytes_done', models.BigIntegerField(default=0)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('downloading', 'Downloading'), ('verifying', 'Verifying'), ('ready', 'Ready'), ('failed', 'Failed')], default='pending', max_length=12)),
                ('error', models.TextField(blank=True, default='')),
                ('entry', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='files', to='store.modelentry')),
            ],
            options={
                'ordering': ['path'],
                'constraints': [models.UniqueConstraint(fields=('entry', 'path'), name='store_file_unique_path')],
            },
        ),
    ]
