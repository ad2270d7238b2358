"""The model store rules: unverified, downloading and unusable models, and the load time."""

from __future__ import annotations

from appliance.preflight import Finding, ModelFolder, StoreModel, config_from_summary
from appliance.store.config import config_summary
from tests.appliance.preflight.preflight_cases import (
    by_rule,
    check,
    dflash_config,
    kimi_config,
    make_spec,
)

TARGET, DRAFTER = "engine.model_path", "engine.speculative_draft_model_path"
KIMI = "/models/Kimi-K2.6"
SIZE = 595_000_000_000


def _store(**fields: StoreModel) -> list[Finding]:
    return check(make_spec(), store_models={TARGET if k == "target" else DRAFTER: v
                                            for k, v in fields.items()})


def test_a_downloading_model_is_reported_with_its_progress_and_the_deployment_waits() -> None:
    down = StoreModel(path=KIMI, entry_id=1, state="downloading", size_bytes=SIZE,
                      bytes_done=SIZE // 4)
    [info] = by_rule(_store(target=down), "model-downloading")
    assert (info.severity, info.field) == ("info", TARGET)
    assert "still downloading (25 %, 148.75 of 595.00 GB)" in info.message
    assert "waits and starts the engine once the download is verified" in info.message


def test_a_downloading_folder_missing_its_files_is_not_a_file_error() -> None:
    half = ModelFolder(path=KIMI, mounted=True, exists=True, has_config=False)
    down = StoreModel(path=KIMI, entry_id=1, state="verifying", size_bytes=SIZE)
    found = check(make_spec(), model_folders={TARGET: half}, store_models={TARGET: down})
    assert not [f for f in found if f.rule.startswith("model-") and f.severity == "error"]
    # The same folder without a download under way is the file rule's error, as before.
    found = check(make_spec(), model_folders={TARGET: half})
    assert [f.rule for f in found if f.severity == "error"] == ["model-config-missing"]


def test_a_partial_failed_or_cancelled_model_is_an_error_naming_the_field() -> None:
    for state in ("partial", "failed", "cancelled"):
        bad = StoreModel(path="/models/dflash", entry_id=2, state=state,
                         error="sha256 of model.safetensors differs" if state == "failed" else "")
        [error] = by_rule(_store(drafter=bad), "model-not-ready")
        assert (error.severity, error.field) == ("error", DRAFTER)
        assert f"the drafter /models/dflash is {state} in the model store" in error.message
        assert "never mounted into an engine" in error.message
        assert "store page" in error.fix
    failed = _store(drafter=StoreModel(path="/models/d", entry_id=2, state="failed",
                                       error="sha256 of model.safetensors differs"))
    assert ": sha256 of model.safetensors differs;" in by_rule(failed, "model-not-ready")[0].message


def test_a_ready_model_has_no_state_finding() -> None:
    found = _store(target=StoreModel(path=KIMI, entry_id=1, state="ready", size_bytes=SIZE))
    assert not [f for f in found if f.rule.startswith("model-")]


def test_a_folder_the_store_has_no_entry_for_is_reported_unverified() -> None:
    [info] = by_rule(_store(target=StoreModel(path=KIMI)), "model-unverified")
    assert (info.severity, info.field) == ("info", TARGET)
    assert "never checked against a size or checksum" in info.message


def test_the_load_time_is_predicted_from_the_size_and_the_roots_read_rate() -> None:
    ready = StoreModel(path=KIMI, entry_id=1, state="ready", size_bytes=SIZE, read_gbps=1.5)
    [info] = by_rule(_store(target=ready), "load-time")
    assert info.message == ("the model: 595.00 GB of weights at 1.50 GB/s: about 6 min 37 s "
                            "to read (the root's measured sequential read rate)")
    assert info.field == TARGET and info.fix == "nothing to do"


def test_without_a_measured_rate_the_load_time_asks_for_one() -> None:
    [info] = by_rule(_store(drafter=StoreModel(path="/models/d", entry_id=2, state="ready",
                                               size_bytes=3 * 10**9)), "load-time")
    assert "not measured" in info.message and "Measure on the store page" in info.message


def test_a_drafter_summary_for_another_target_fails_the_drafter_rules() -> None:
    # The folder has no config.json yet (downloading): the store's summary stands in.
    other = config_from_summary(config_summary({**dflash_config(), "hidden_size": 4096}))
    found = check(make_spec(), drafter_config=other)
    [error] = by_rule(found, "drafter-matches-target")
    assert error.message == "drafter hidden_size 4096 differs from the target's 7168"


def test_a_drafter_summary_for_another_block_size_fails_the_block_rule() -> None:
    small = config_from_summary(config_summary(dflash_config(block_size=4)))
    assert small is not None and small["dflash_config"]["block_size"] == 4
    [error] = [f for f in by_rule(check(make_spec(), drafter_config=small),
                                  "block-size-agreement") if f.severity == "error"]
    assert "larger than the drafter's trained block size 4" in error.message


def test_a_target_summary_keeps_what_the_target_rules_read() -> None:
    config = config_from_summary(config_summary(kimi_config()))
    assert config is not None
    assert {k: config[k] for k in ("hidden_size", "vocab_size", "num_hidden_layers",
                                   "n_routed_experts", "kv_lora_rank")} == {
        "hidden_size": 7168, "vocab_size": 163840, "num_hidden_layers": 61,
        "n_routed_experts": 384, "kv_lora_rank": 512}
    assert config_from_summary({}) is None
