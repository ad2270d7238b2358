"""Plain API tokens (rest_framework.authtoken, stored as they are) become hashed ones
(knox: only a digest is kept). A client keeps using the token it has: knox finds it by its
first characters and checks the digest. The plain rows are deleted."""

from django.db import migrations


def hash_plain_tokens(apps, schema_editor):  # type: ignore[no-untyped-def]
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS

    plain = apps.get_model("authtoken", "Token")
    hashed = apps.get_model("knox", "AuthToken")
    hashed.objects.bulk_create([
        hashed(digest=hash_token(token.key), token_key=token.key[:CONSTANTS.TOKEN_KEY_LENGTH],
               user_id=token.user_id, expiry=None)
        for token in plain.objects.all()])
    plain.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("authtoken", "0004_alter_tokenproxy_options"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    operations = [migrations.RunPython(hash_plain_tokens, migrations.RunPython.noop)]
