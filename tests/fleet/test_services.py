"""Join tokens, the join, a host's heartbeat, drain, removal and its events' scope."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from appliance.logs.catalogue import CATALOGUE
from tests.rows import queued, ready
from web.deployments.models import Deployment, Event
from web.deployments.services import deployment_mark_failed
from web.fleet import heartbeat, hostwrites, selectors, services
from web.fleet.models import FleetHost, JoinToken

from .hosts import joined, report

pytestmark = pytest.mark.django_db


def _facts(**changes):  # type: ignore[no-untyped-def]
    return services.host_facts_from(report(**changes))


def test_a_join_token_is_kept_only_as_its_hash() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    row = JoinToken.objects.get(pk=made.token.pk)
    assert made.secret.startswith(f"sdj-{row.prefix}") and len(made.secret) > 40
    assert row.digest == services.secret_digest(made.secret)
    assert made.secret not in str(list(JoinToken.objects.values()))


def test_it_refuses_a_host_name_that_is_not_a_slug() -> None:
    with pytest.raises(services.FleetError) as caught:
        services.jointoken_create(host_name="GPU 2/evil")
    assert caught.value.field == "host_name" and "lowercase letters" in str(caught.value)


def test_it_refuses_a_lifetime_past_thirty_days() -> None:
    with pytest.raises(services.FleetError) as caught:
        services.jointoken_create(host_name="gpu-2", ttl_hours=24 * 31)
    assert caught.value.field == "ttl_hours"


def test_a_host_joins_and_gets_its_own_credential_kept_hashed() -> None:
    done = joined("gpu-2")
    host = FleetHost.objects.get(name="gpu-2")
    assert done.credential.startswith("sdh-") and host.credential_digest == \
        services.secret_digest(done.credential)
    assert host.agent_version == "0.9.0" and len(host.gpus) == 8 and host.gpu_source == "nvml"
    assert host.docker["nvidia"] is True and host.heartbeat_at is not None
    assert selectors.host_for_credential(credential=done.credential) == host
    token = JoinToken.objects.get()
    assert (token.used_by, token.uses) == ("gpu-2", 1) and token.last_used_at is not None


def test_the_join_writes_the_report_row_pre_flight_reads() -> None:
    joined("gpu-2")
    report_row = FleetHost.objects.get(name="gpu-2")
    assert report_row.gpu_telemetry["available"] is True
    assert len(report_row.gpu_telemetry["gpus"]) == 8 and report_row.secret_names == ["HF_TOKEN"]


def test_a_host_without_nvml_states_a_gpu_count() -> None:
    facts = services.host_facts_from({"agent_version": "0.9.0", "gpu_count": 2, "docker": {}})
    assert facts.gpu_source == "count" and facts.gpus == [{"index": 0}, {"index": 1}]


def test_it_refuses_a_report_without_gpus_or_a_count() -> None:
    with pytest.raises(services.FleetError) as caught:
        services.host_facts_from({"agent_version": "0.9.0", "docker": {}})
    assert caught.value.field == "gpus" and "gpu_count" in str(caught.value)


def test_a_token_joins_only_the_host_it_names() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    with pytest.raises(services.JoinRefused, match="for host 'gpu-2', not 'gpu-3'"):
        services.host_join(token=made.secret, name="gpu-3", facts=_facts())
    assert not FleetHost.objects.exists()


def test_an_expired_token_joins_no_host() -> None:
    made = services.jointoken_create(host_name="gpu-2", ttl_hours=1)
    JoinToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(services.JoinRefused, match="expired"):
        services.host_join(token=made.secret, name="gpu-2", facts=_facts())
    assert not FleetHost.objects.exists()


def test_a_revoked_token_joins_no_host() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    assert services.jointoken_revoke(token_id=made.token.pk)
    with pytest.raises(services.JoinRefused, match="revoked"):
        services.host_join(token=made.secret, name="gpu-2", facts=_facts())
    assert not services.jointoken_revoke(token_id=made.token.pk)  # once


def test_a_made_up_token_joins_no_host() -> None:
    with pytest.raises(services.JoinRefused, match="not one the panel made"):
        services.host_join(token="sdj-0000000000", name="gpu-2", facts=_facts())


def test_a_token_is_spent_by_its_join_and_a_join_again_takes_a_new_token() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    first = services.host_join(token=made.secret, name="gpu-2", facts=_facts())
    with pytest.raises(services.JoinRefused) as refused:
        services.host_join(token=made.secret, name="gpu-2", facts=_facts())
    assert str(refused.value).startswith(
        f"This join token (sdj-{made.token.prefix}) was spent when host 'gpu-2' joined with it "
        "at ")
    assert "ask an admin for a new token on the panel's Join tokens page" in str(refused.value)
    # The live host's credential is untouched by the refused second use.
    assert selectors.host_for_credential(credential=first.credential) == first.host
    assert selectors.jointoken_state(token=JoinToken.objects.get(), now=timezone.now()) == \
        "spent"
    again = services.jointoken_create(host_name="gpu-2")
    second = services.host_join(token=again.secret, name="gpu-2", facts=_facts())
    assert selectors.host_for_credential(credential=first.credential) is None
    assert selectors.host_for_credential(credential=second.credential) == second.host
    assert FleetHost.objects.count() == 1
    assert sorted(JoinToken.objects.values_list("uses", flat=True)) == [1, 1]


def test_neither_a_join_token_nor_garbage_is_a_credential() -> None:
    made = services.jointoken_create(host_name="gpu-2")
    services.host_join(token=made.secret, name="gpu-2", facts=_facts())
    for text in (made.secret, "", "sdh-", "sdh-" + "x" * 500, "Token abc"):
        assert selectors.host_for_credential(credential=text) is None


def test_a_host_is_lost_once_its_heartbeat_is_older_than_the_threshold(settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENT_SILENT_S = 30
    host = joined("gpu-2").host
    now = timezone.now()
    assert heartbeat.host_state(host=host, now=now) == "ready"
    assert heartbeat.host_state(host=host, now=now + timedelta(seconds=31)) == "lost"
    services.host_heartbeat(host=host, facts=_facts())
    assert heartbeat.host_state(host=host, now=timezone.now()) == "ready"


def test_the_heartbeat_takes_the_hosts_facts_now() -> None:
    host = joined("gpu-2").host
    services.host_heartbeat(host=host, facts=_facts(agent_version="1.0.0", gpus=None,
                                                    gpu_count=4))
    host.refresh_from_db()
    assert (host.agent_version, host.gpu_source, len(host.gpus)) == ("1.0.0", "count", 4)


def test_a_drained_host_takes_no_new_placement_and_says_so() -> None:
    joined("gpu-2")
    host = services.host_set_draining(name="gpu-2", draining=True)
    assert host.draining and heartbeat.host_state(host=host, now=timezone.now()) == "draining"
    with pytest.raises(services.FleetError, match="draining"):
        services.placement_assign(deployment=queued(), host_name="gpu-2")
    services.host_set_draining(name="gpu-2", draining=False)
    assert services.placement_assign(deployment=queued(name="second", gpus=[1]), host_name="gpu-2").host.name == "gpu-2"


def test_a_host_running_an_engine_is_not_removed_and_the_refusal_names_it() -> None:
    joined("gpu-2")
    running = ready()
    services.placement_assign(deployment=running, host_name="gpu-2")
    with pytest.raises(services.FleetError, match=rf"#{running.pk} kimi-ddtree \(ready\)"):
        services.host_remove(name="gpu-2")
    assert FleetHost.objects.filter(name="gpu-2").exists()


def test_a_host_whose_engines_ended_is_removed_with_its_credential_and_tokens() -> None:
    done = joined("gpu-2")
    ended = ready()
    services.placement_assign(deployment=ended, host_name="gpu-2")
    deployment_mark_failed(deployment_id=ended.pk,
                           diagnosis=CATALOGUE["cuda-oom-load"].diagnosis(), last_lines=[])
    assert services.host_remove(name="gpu-2") == 1  # the token it joined with, still usable
    assert selectors.host_for_credential(credential=done.credential) is None
    assert not FleetHost.objects.filter(name="gpu-2").exists()
    assert JoinToken.objects.get().revoked_at is not None
    assert Deployment.objects.filter(pk=ended.pk).exists()


def test_a_host_stores_events_for_a_deployment_placed_on_it() -> None:
    host = joined("gpu-2").host
    mine = ready()
    services.placement_assign(deployment=mine, host_name="gpu-2")
    batch = hostwrites.event_batch_from({
        "events": [["log", {"stream": "stdout", "text": "Decode batch"}],
                   ["metric", {"kind": "decode_stats", "tokens": 3}]],
        "row": {"log_cursor": "1767225600.5", "decode_stats": {"tokens": 3}}})
    last = hostwrites.host_events_append(host=host, deployment_id=mine.pk, batch=batch)
    assert [(e.seq, e.kind) for e in Event.objects.filter(deployment=mine).order_by("seq")
            if e.seq > last - 2] == [(last - 1, "log"), (last, "metric")]
    mine.refresh_from_db()
    assert mine.log_cursor == "1767225600.5" and mine.decode_stats == {"tokens": 3}


def test_a_host_cannot_write_another_hosts_deployment() -> None:
    mine = joined("gpu-2").host
    joined("gpu-3")
    theirs = ready()
    services.placement_assign(deployment=theirs, host_name="gpu-3")
    before = Event.objects.filter(deployment=theirs).count()
    batch = hostwrites.event_batch_from({"events": [["log", {"stream": "stdout", "text": "x"}]]})
    with pytest.raises(hostwrites.NotPlacedHere):
        hostwrites.host_events_append(host=mine, deployment_id=theirs.pk, batch=batch)
    with pytest.raises(hostwrites.NotPlacedHere):
        hostwrites.host_events_append(host=mine, deployment_id=theirs.pk + 1000, batch=batch)
    assert Event.objects.filter(deployment=theirs).count() == before


@pytest.mark.parametrize("kind", ["status", "end", "phase", "alert", "nonsense"])
def test_a_host_may_not_append_the_panels_own_kinds(kind: str) -> None:
    with pytest.raises(services.FleetError, match="a host may append"):
        hostwrites.event_batch_from({"events": [[kind, {}]]})


def test_a_host_appends_the_build_events_of_the_images_it_builds() -> None:
    batch = hostwrites.event_batch_from({"events": [["build", {"kind": "build_step",
                                                             "text": "RUN x", "step": 1}]]})
    assert batch.events == [("build", {"kind": "build_step", "text": "RUN x", "step": 1})]


def test_a_host_may_set_only_its_engines_row_fields() -> None:
    with pytest.raises(services.FleetError, match="row may set only"):
        hostwrites.event_batch_from({"events": [["log", {"text": "x"}]],
                                   "row": {"status": "ready"}})
