# The routing table holds more of each row since replicas (web/gateway/selectors.py): whether
# it is drained, which replica 0 it belongs to, its speculative algorithm and companion (the
# requests it must hand on), the agent that claimed it and the joined host it is placed on
# (whose heartbeat says whether its host is lost). A change of any of them must reach the
# gateway's watch as 0002's columns do: the update trigger's condition names them too, and a
# placement made, moved or removed notifies the same channel.
from django.db import migrations

_CHANNEL = "appliance_gateway_routes"  # watches.ROUTES_CHANNEL; a test checks they agree

_UPDATE = """
CREATE TRIGGER appliance_gateway_routes_update
    AFTER UPDATE ON deployments_deployment FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.engine_url IS DISTINCT FROM NEW.engine_url
          OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.created_at IS DISTINCT FROM NEW.created_at
          OR OLD.draining IS DISTINCT FROM NEW.draining
          OR OLD.replica_of_id IS DISTINCT FROM NEW.replica_of_id
          OR OLD.algorithm IS DISTINCT FROM NEW.algorithm
          OR OLD.agent_id IS DISTINCT FROM NEW.agent_id
          OR (OLD.spec #>> '{engine,served_model_name}')
             IS DISTINCT FROM (NEW.spec #>> '{engine,served_model_name}')
          OR (OLD.spec #>> '{engine,context_length}')
             IS DISTINCT FROM (NEW.spec #>> '{engine,context_length}')
          OR (OLD.spec #>> '{companion}') IS DISTINCT FROM (NEW.spec #>> '{companion}'))
    EXECUTE FUNCTION appliance_gateway_routes_changed()"""

_UPDATE_0002 = """
CREATE TRIGGER appliance_gateway_routes_update
    AFTER UPDATE ON deployments_deployment FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.engine_url IS DISTINCT FROM NEW.engine_url
          OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.created_at IS DISTINCT FROM NEW.created_at
          OR (OLD.spec #>> '{engine,served_model_name}')
             IS DISTINCT FROM (NEW.spec #>> '{engine,served_model_name}'))
    EXECUTE FUNCTION appliance_gateway_routes_changed()"""

_DROP_UPDATE = "DROP TRIGGER IF EXISTS appliance_gateway_routes_update ON deployments_deployment"

_FORWARD = [_DROP_UPDATE, _UPDATE, """
CREATE TRIGGER appliance_gateway_routes_placements
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fleet_placement
    FOR EACH STATEMENT EXECUTE FUNCTION appliance_gateway_routes_changed()"""]

_BACKWARD = [
    "DROP TRIGGER IF EXISTS appliance_gateway_routes_placements ON fleet_placement",
    _DROP_UPDATE, _UPDATE_0002]


def _run(statements: list[str]):  # type: ignore[no-untyped-def]
    def run(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":  # SQLite polls (0002)
            for sql in statements:
                schema_editor.execute(sql, None)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ("gateway", "0002_routes_notify"),
        ("deployments", "0013_replicas"),
        ("fleet", "0001_initial"),
    ]

    operations = [migrations.RunPython(_run(_FORWARD), _run(_BACKWARD))]
