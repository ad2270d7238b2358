# The gateway's routing table is read again when PostgreSQL says it changed (web/gateway/
# routing.py, RoutesWatch), not once a second: a trigger on the deployments table notifies
# channel "appliance_gateway_routes" when a row the table holds changes (inserted, deleted,
# truncated, or its status, engine URL, name, served model name or creation time updated).
# PostgreSQL delivers a notification at commit and once per transaction, and every writer of
# the table is covered, the ORM's QuerySet.update() and raw SQL included. Updates of other
# columns (the status summary, kept current by its writers) notify nothing.
from django.db import migrations

_CHANNEL = "appliance_gateway_routes"  # watches.ROUTES_CHANNEL; a test checks they agree

# One statement each: the panel's connections bind parameters server-side, and that
# protocol takes one statement at a time.
_FORWARD = [f"""
CREATE OR REPLACE FUNCTION appliance_gateway_routes_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{_CHANNEL}', '');
    RETURN NULL;
END
$$""", """
CREATE TRIGGER appliance_gateway_routes_rows
    AFTER INSERT OR DELETE ON deployments_deployment
    FOR EACH STATEMENT EXECUTE FUNCTION appliance_gateway_routes_changed()""", """
CREATE TRIGGER appliance_gateway_routes_truncate
    AFTER TRUNCATE ON deployments_deployment
    FOR EACH STATEMENT EXECUTE FUNCTION appliance_gateway_routes_changed()""", """
CREATE TRIGGER appliance_gateway_routes_update
    AFTER UPDATE ON deployments_deployment FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.engine_url IS DISTINCT FROM NEW.engine_url
          OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.created_at IS DISTINCT FROM NEW.created_at
          OR (OLD.spec #>> '{engine,served_model_name}')
             IS DISTINCT FROM (NEW.spec #>> '{engine,served_model_name}'))
    EXECUTE FUNCTION appliance_gateway_routes_changed()"""]

_BACKWARD = [
    "DROP TRIGGER IF EXISTS appliance_gateway_routes_update ON deployments_deployment",
    "DROP TRIGGER IF EXISTS appliance_gateway_routes_truncate ON deployments_deployment",
    "DROP TRIGGER IF EXISTS appliance_gateway_routes_rows ON deployments_deployment",
    "DROP FUNCTION IF EXISTS appliance_gateway_routes_changed()"]


def _run(statements: list[str]):  # type: ignore[no-untyped-def]
    def run(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
        # PostgreSQL's alone: the developer's SQLite panel has no LISTEN, and polls.
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql, None)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ("gateway", "0001_initial"),
        ("deployments", "0011_model_store"),
    ]

    operations = [migrations.RunPython(_run(_FORWARD), _run(_BACKWARD))]
