"""A root scan on real folders: what each model is, whether it is whole, and the rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.store.config import config_summary
from appliance.store.scan import MARKER, scan_root
from tests.models import safetensors_bytes, write_model
from web.store import selectors, services
from web.store.models import ModelEntry, ModelState

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168,
                        "vocab_size": 163840, "n_routed_experts": 384,
                        "num_experts_per_tok": 8, "kv_lora_rank": 512, "q_lora_rank": 1536,
                        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                        "quantization_config": {"quant_method": "compressed-tensors"}}}
DRAFTER = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 7168,
           "vocab_size": 163840, "num_hidden_layers": 6,
           "dflash_config": {"block_size": 8, "target_layer_ids": [1, 15, 30, 45, 59]}}


def test_the_summary_has_the_key_values_of_a_kimi_checkpoint() -> None:
    summary = config_summary(KIMI)
    assert summary["model_type"] == "kimi_k2" and summary["num_hidden_layers"] == 61
    assert summary["experts"] == 384 and summary["experts_per_token"] == 8
    assert summary["mla"] == {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                              "qk_rope_head_dim": 64, "v_head_dim": 128}
    assert summary["quantization"] == {"quant_method": "compressed-tensors"}
    assert summary["vocab_size"] == 163840 and "drafter" not in summary


def test_a_dflash_drafter_is_told_apart_with_its_block_size_and_target_layers(tmp_path: Path) -> None:
    write_model(tmp_path / "Kimi-K2.6-DFlash", DRAFTER)
    (found,) = scan_root(tmp_path)
    assert found.kind == "drafter" and found.whole
    assert found.config["drafter"] == {"block_size": 8, "target_layer_ids": [1, 15, 30, 45, 59],
                                       "num_target_layers": None}


def test_a_shard_cut_short_makes_the_folder_partial(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "cut")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-3])
    (found,) = scan_root(tmp_path)
    assert not found.whole and "cut short" in found.problems[0]


def test_a_shard_the_index_names_but_missing_makes_it_partial(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "two")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-2.safetensors"}}))
    (found,) = scan_root(tmp_path)
    assert found.problems == ("model-2.safetensors is named in model.safetensors.index.json "
                              "but missing",)


def test_a_file_still_downloading_makes_it_partial(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "half")
    (folder / "model-2.safetensors.incomplete").write_bytes(safetensors_bytes()[:10])
    (found,) = scan_root(tmp_path)
    assert "model-2.safetensors.incomplete is still being downloaded" in found.problems
    assert found.file_count == 2  # the part is not counted


def test_the_hugging_face_cache_layout_gives_repo_and_revision(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--acme--tiny"
    commit = "a" * 40
    write_model(repo / "snapshots" / commit, {"model_type": "llama"})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (found,) = scan_root(tmp_path)
    assert (found.repo_id, found.revision, found.commit) == ("acme/tiny", "main", commit)


def test_a_marker_gives_repo_and_revision_and_checks_each_size(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "acme" / "m")
    (folder / MARKER).write_text(json.dumps({"repo_id": "acme/m", "revision": "v1",
                                             "commit": "c" * 40, "files": [
                                                 {"path": "model.safetensors", "size": 999}]}))
    (found,) = scan_root(tmp_path)
    assert found.relative_path == "acme/m" and found.repo_id == "acme/m"
    assert "model.safetensors is" in found.problems[0] and "999" in found.problems[0]


@pytest.mark.django_db
def test_the_scan_service_makes_rows_and_drops_a_local_folder_that_went(tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.MODEL_ROOTS = [str(tmp_path)]
    write_model(tmp_path / "Kimi-K2.6", KIMI)
    write_model(tmp_path / "Kimi-K2.6-DFlash", DRAFTER)
    cut = write_model(tmp_path / "cut")
    (cut / "model.safetensors").write_bytes(b"\0" * 4)
    services.model_store_scan()
    states = {e.relative_path: (e.state, e.kind) for e in selectors.model_entries_list()}
    assert states == {"Kimi-K2.6": ("ready", "target"), "Kimi-K2.6-DFlash": ("ready", "drafter"),
                      "cut": ("partial", "target")}
    entry = selectors.model_entry_for_path(engine_path="/models/Kimi-K2.6/")
    assert entry is not None and entry.is_usable and entry.config["experts"] == 384
    assert selectors.model_entry_for_path(engine_path="/models/../etc") is None
    assert selectors.model_entry_for_path(engine_path="/elsewhere/Kimi-K2.6") is None
    (tmp_path / "cut" / "model.safetensors").unlink()
    (tmp_path / "cut" / "config.json").unlink()
    services.model_store_scan()
    assert not ModelEntry.objects.filter(relative_path="cut").exists()
    assert selectors.model_entries_list(state=ModelState.READY).count() == 2


@pytest.mark.django_db
def test_a_scan_leaves_an_entry_a_download_works_on_alone(tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.MODEL_ROOTS = [str(tmp_path)]
    entry = services.model_download_request(repo_id="acme/tiny")
    write_model(tmp_path / "acme" / "tiny")
    services.model_store_scan()
    entry.refresh_from_db()
    assert entry.state == ModelState.DOWNLOADING and entry.source == "hub"


@pytest.mark.django_db(transaction=True)
def test_scans_of_a_root_run_one_at_a_time(tmp_path: Path, settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The worker scans at its start, a person asks for a scan, another process does too:
    two scans at once each found a new folder with no row yet and both made it (a unique
    violation, CI 2026-12-07). The second waits for the first, then finds its rows."""
    import threading

    from django.db import connection

    from web.store.services import scan as scan_module

    for name in ("Kimi-K2.6", "Kimi-K2.6-DFlash", "small"):
        write_model(tmp_path / name)
    settings.MODEL_ROOTS = [str(tmp_path)]
    inside, go_on = threading.Event(), threading.Event()
    real_scan_root = scan_module.scan_root
    calls = []

    def held_first(root: str):  # type: ignore[no-untyped-def]
        calls.append(root)
        if len(calls) == 1:
            inside.set()
            assert go_on.wait(30)
        return real_scan_root(root)

    monkeypatch.setattr(scan_module, "scan_root", held_first)
    results: dict[str, object] = {}

    def scan(name: str) -> None:
        try:
            results[name] = [e.relative_path for e in services.model_store_scan()]
        except Exception as exc:  # noqa: BLE001 - reported by the assertions below
            results[name] = exc
        finally:
            connection.close()

    first = threading.Thread(target=scan, args=("first",))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=scan, args=("second",))
    second.start()
    second.join(1.5)
    assert second.is_alive(), "the second scan ran while the first held the root"
    go_on.set()
    first.join(30)
    second.join(30)
    assert results["first"] == results["second"] == ["Kimi-K2.6", "Kimi-K2.6-DFlash", "small"]
    assert sorted(ModelEntry.objects.values_list("relative_path", flat=True)) == \
        ["Kimi-K2.6", "Kimi-K2.6-DFlash", "small"]
