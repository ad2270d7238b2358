"""A root's read rate and the load time it predicts, measured on real files on this disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.store.diskrate import (
    FADVISE,
    MEMORY,
    O_DIRECT,
    ReadRateError,
    filesystem_type,
    measure_read_rate,
    page_cache_share,
)
from appliance.store.loadtime import (
    describe_load,
    load_report,
    load_seconds,
    load_text,
    measured_load,
    predict_load,
    rate_text,
)

ROOT = Path(__file__).resolve().parents[3]
MIB = 1024**2
SHM = Path("/dev/shm")


def _model(folder: Path, shards: int = 3, size: int = 4 * MIB) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    for i in range(shards):
        (folder / f"model-{i:05d}-of-{shards:05d}.safetensors").write_bytes(os.urandom(size))
    return folder


def test_it_reads_every_weight_file_bypassing_the_cache_with_o_direct(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    rate = measure_read_rate(model, block=MIB)
    assert rate.method == O_DIRECT
    assert rate.bytes_read == 3 * 4 * MIB
    assert "only 12.6 MB of weights to read" in rate.note  # too little to be a disk's rate
    assert sorted(Path(f).name for f in rate.files) == sorted(
        p.name for p in model.glob("*.safetensors"))
    assert rate.gbps > 0 and rate.to_dict()["gbps"] == round(rate.gbps, 3)


def test_it_stops_at_the_byte_budget(tmp_path: Path) -> None:
    rate = measure_read_rate(_model(tmp_path / "m"), block=MIB, max_bytes=2 * MIB, threads=2)
    assert rate.bytes_read == 2 * MIB


def test_it_reads_the_largest_weight_files_first(tmp_path: Path) -> None:
    model = _model(tmp_path / "m", shards=1, size=MIB)
    (model / "big.safetensors").write_bytes(os.urandom(3 * MIB))
    rate = measure_read_rate(model, block=MIB, max_bytes=3 * MIB, threads=1)
    assert [Path(f).name for f in rate.files] == ["big.safetensors"]


def test_it_reads_a_file_whose_size_is_not_a_multiple_of_the_block(tmp_path: Path) -> None:
    shard = tmp_path / "odd.safetensors"
    shard.write_bytes(os.urandom(MIB + 12345))
    rate = measure_read_rate(shard, block=MIB)
    assert rate.bytes_read == MIB + 12345 and rate.method == O_DIRECT


def test_it_drops_the_cache_with_fadvise_when_o_direct_is_not_used_and_says_so(
        tmp_path: Path) -> None:
    rate = measure_read_rate(_model(tmp_path / "m", shards=1, size=MIB), block=MIB,
                             direct=False)
    assert rate.method == FADVISE and "posix_fadvise(DONTNEED)" in rate.note
    assert rate.bytes_read == MIB


@pytest.mark.skipif(filesystem_type(SHM) != "tmpfs", reason="no tmpfs at /dev/shm")
def test_it_says_a_root_in_ram_measures_memory_not_a_disk() -> None:
    folder = SHM / f"diskrate-{os.getpid()}"
    try:
        _model(folder, shards=1, size=MIB)
        rate = measure_read_rate(folder, block=MIB)
        assert rate.method == MEMORY and "in RAM" in rate.note
        assert rate.bytes_read == MIB
    finally:
        for p in folder.glob("*"):
            p.unlink()
        folder.rmdir()


def test_it_knows_the_filesystem_of_a_path(tmp_path: Path) -> None:
    assert filesystem_type(tmp_path / "not-yet") == filesystem_type(tmp_path) != ""


def test_it_refuses_a_folder_without_weight_files_naming_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ReadRateError, match=f"{tmp_path}: no weight files"):
        measure_read_rate(tmp_path)


def test_it_refuses_a_block_the_page_size_does_not_divide(tmp_path: Path) -> None:
    with pytest.raises(ReadRateError, match="multiple of"):
        measure_read_rate(_model(tmp_path / "m"), block=1000)


def test_the_load_time_is_the_size_over_the_rate() -> None:
    assert load_seconds(weights_bytes=590 * 10**9, rate_gbps=1.5) == pytest.approx(393.3, 0.01)
    assert load_seconds(weights_bytes=10**9, rate_gbps=0) is None
    assert describe_load(weights_bytes=6 * 10**9, rate_gbps=2.0) == \
        "6.00 GB of weights at 2.00 GB/s: about 3.0 s to read"
    assert "not measured" in describe_load(weights_bytes=10**9, rate_gbps=None)


def test_a_prediction_counts_the_weight_files_on_disk_and_measures_their_disk(
        tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    given = predict_load(model, rate_gbps=0.5)
    assert given.weights_bytes == 12 * MIB and given.rate is None
    assert given.seconds == pytest.approx(12 * MIB / 1e9 / 0.5)
    measured = predict_load(model)
    assert measured.rate is not None and measured.rate.bytes_read == 12 * MIB
    assert measured.rate_gbps == measured.rate.gbps


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance", "store", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_read_rate_command_prints_the_measurement_as_json(tmp_path: Path) -> None:
    done = _cli("read-rate", str(_model(tmp_path / "m")))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["bytes_read"] == 12 * MIB and out["method"] == O_DIRECT and out["gbps"] > 0


def test_the_predict_command_prints_the_expected_seconds(tmp_path: Path) -> None:
    done = _cli("predict", str(_model(tmp_path / "m")), "--rate-gbps", "0.012", "--text")
    assert done.returncode == 0, done.stderr
    # (then, since the files were just written, that they sit in the page cache)
    assert done.stdout.splitlines()[0] == "0.01 GB of weights at 0.01 GB/s: about 1.0 s to read"


def test_the_commands_fail_with_a_message_on_a_missing_folder(tmp_path: Path) -> None:
    for command in ("read-rate", "predict"):
        done = _cli(command, str(tmp_path / "nope"))
        assert done.returncode == 1
        assert json.loads(done.stdout) == {"error": f"{tmp_path / 'nope'}: no such "
                                           f"{'file or folder' if command == 'read-rate' else 'folder'}"}


def test_the_load_report_gives_the_engines_rate_and_its_share_of_the_disks() -> None:
    estimate = {"weights": {"bytes": 6 * 10**9, "read_gbps": 2.0, "expected_s": 3.0}}
    loading = load_report(estimate=estimate, progress={"weights": {"done": 1, "total": 4}})
    assert loading == {"weights": {"bytes": 6 * 10**9, "read_gbps": 2.0, "expected_s": 3.0}}
    # The real engine's line: "Load weight end. elapsed=4.00 s, ... mem usage=5.59 GB."
    loaded = load_report(estimate=estimate, progress={"weights": {
        "finished": True, "elapsed_s": 4.0, "mem_usage_gb": 5.59, "ranks": 1}})
    assert loaded["weights"] == {"bytes": 6 * 10**9, "read_gbps": 2.0, "expected_s": 3.0,
                                 "elapsed_s": 4.0, "gbps": 1.5, "share": 0.75}


def test_without_an_estimate_the_rate_comes_from_the_logs_memory_use_on_every_rank() -> None:
    # tests/fixtures/real-engine/433c58ed7: "elapsed=0.23 s, ... mem usage=0.12 GB" on TP0.
    report = load_report(estimate={}, progress={"weights": {
        "finished": True, "elapsed_s": 0.23, "mem_usage_gb": 0.12, "ranks": 2}})
    assert report["weights"]["gbps"] == float(f"{0.12 * 2**30 * 2 / 1e9 / 0.23:.3g}")
    assert "share" not in report["weights"] and "draft_weights" not in report


def test_a_slow_load_is_written_in_mb_per_second() -> None:
    row = {"bytes": 134_217_728, "read_gbps": 0.91, "expected_s": 0.15,
           "elapsed_s": 30.3, "gbps": 0.004, "share": 0.0044}
    assert load_text(row) == ("read at 4.0 MB/s in 30.3 s: 0.44 % of the disk's measured "
                              "0.91 GB/s (expected 0.1 s)")


def test_a_tiny_checkpoints_load_keeps_its_rate_rather_than_reading_0() -> None:
    # The simulator's model: 100 bytes read in 0.4 s (its engine prints the time it took).
    report = load_report(estimate={"weights": {"bytes": 100, "read_gbps": 1.5,
                                               "expected_s": 0.0}},
                         progress={"weights": {"finished": True, "elapsed_s": 0.4}})
    row = report["weights"]
    assert row["gbps"] == 2.5e-7 and row["share"] == float(f"{2.5e-7 / 1.5:.3g}")
    text = load_text(row)
    assert text.startswith("read at 0.2 kB/s in 0.4 s: ") and "0.0 MB/s" not in text
    assert rate_text(2.5e-8) == "25 bytes/s" and rate_text(0.004) == "4.0 MB/s"
    assert rate_text(1.2) == "1.20 GB/s"


def _fsynced(model: Path) -> Path:
    for shard in model.glob("*.safetensors"):
        with shard.open("rb+") as handle:
            os.fsync(handle.fileno())  # clean pages: DONTNEED drops only those
    return model


def test_the_page_cache_share_sees_weights_read_and_weights_dropped(tmp_path: Path) -> None:
    model = _fsynced(_model(tmp_path / "m"))
    for shard in model.glob("*.safetensors"):
        shard.read_bytes()
    assert page_cache_share(model) == pytest.approx(1.0, abs=0.05)
    for shard in model.glob("*.safetensors"):
        fd = os.open(shard, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert page_cache_share(model) == pytest.approx(0.0, abs=0.05)
    # An O_DIRECT measurement leaves it so, and says what was cached before it.
    rate = measure_read_rate(model, block=MIB)
    assert rate.cached_before == pytest.approx(0.0, abs=0.05)
    assert page_cache_share(model) == pytest.approx(0.0, abs=0.05)


def test_a_prediction_warns_when_the_weights_sit_in_the_page_cache(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    for shard in model.glob("*.safetensors"):
        shard.read_bytes()
    done = _cli("predict", str(model), "--rate-gbps", "1", "--text")
    assert "100 % of these weights are in the page cache" in done.stdout


def test_the_predict_command_puts_the_engines_measured_load_beside_it(tmp_path: Path) -> None:
    # The real engine's log (433c58ed7): the target's "Load weight end. elapsed=0.26 s".
    log = ROOT / "tests/fixtures/real-engine/433c58ed7/ddtree_triton/engine.log"
    done = _cli("predict", str(_model(tmp_path / "m")), "--rate-gbps", "0.1",
                "--log", str(log))
    out = json.loads(done.stdout)
    assert out["measured_s"] == 0.26 and out["seconds"] == 0.1
    assert out["measured_over_predicted"] == round(0.26 / (12 * MIB / 1e9 / 0.1), 3)
    assert out["measured_gbps"] == round(12 * MIB / 1e9 / 0.26, 3)
    with (log.open(encoding="utf-8", newline="\n")) as handle:
        assert measured_load(handle) == {"weights": 0.26, "draft_weights": 0.02}


def test_the_log_reader_finds_the_target_load_of_the_h200_recording() -> None:
    # 433c58ed7 on the H200, big-kimi (5.86 GB, 9 shards) from a cold cache, as `docker logs
    # -t` gave it: what `predict --log` puts beside the prediction (the prediction against
    # it is held in test_load_time_real_engine).
    log = ROOT / "tests/fixtures/real-engine/433c58ed7/bigload_triton/engine.log"
    with log.open(encoding="utf-8", newline="\n") as handle:
        assert measured_load(handle) == {"weights": 5.16}
