"""The weight-load time you can predict: a model's bytes on disk over its root's read rate.

The engine reads every weight file once at load (each TP rank its part, from the same
page cache), so the disk's sequential rate bounds the load from below; a load far slower
than the disk (the seed's 590 GB in 390 s is 1.5 GB/s) points at the loader, not the disk.
Also the `appliance store read-rate|predict` commands, which need no Django.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.logs.parser import parse_lines
from appliance.logs.stamps import without_docker_stamps
from appliance.store.diskrate import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SECONDS,
    DEFAULT_THREADS,
    WEIGHT_SUFFIXES,
    ReadRate,
    ReadRateError,
    measure_read_rate,
    page_cache_share,
)

GB = 1e9


def weights_bytes_on_disk(model_dir: str | os.PathLike[str]) -> int:
    """The bytes of a checkpoint's weight files (flat, as Hugging Face keeps them)."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ReadRateError(f"{folder}: no such folder")
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file())


def load_seconds(*, weights_bytes: int, rate_gbps: float) -> float | None:
    """Seconds to read weights_bytes at rate_gbps; None when there is no rate to go by."""
    if rate_gbps <= 0:
        return None
    return weights_bytes / GB / rate_gbps


@dataclass(frozen=True)
class LoadPrediction:
    model_dir: str
    weights_bytes: int
    rate_gbps: float
    seconds: float | None
    rate: ReadRate | None = None  # the measurement made for it, when none was given
    # The share of its weights in the page cache now: an engine loading them reads RAM.
    page_cached: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"model_dir": self.model_dir, "weights_bytes": self.weights_bytes,
                "weights_gb": round(self.weights_bytes / GB, 3),
                "rate_gbps": round(self.rate_gbps, 3),
                "seconds": round(self.seconds, 1) if self.seconds is not None else None,
                "rate": self.rate.to_dict() if self.rate else None,
                "page_cached": self.page_cached}


def predict_load(model_dir: str | os.PathLike[str], *, rate_gbps: float | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 max_seconds: float = DEFAULT_MAX_SECONDS) -> LoadPrediction:
    """Expected load seconds of a model folder; without a rate, its own disk is measured."""
    size = weights_bytes_on_disk(model_dir)
    cached = page_cache_share(model_dir) if size else None
    rate = None
    if rate_gbps is None:
        rate = measure_read_rate(model_dir, max_bytes=max_bytes, max_seconds=max_seconds)
        rate_gbps = rate.gbps
    return LoadPrediction(model_dir=str(model_dir), weights_bytes=size, rate_gbps=rate_gbps,
                          seconds=load_seconds(weights_bytes=size, rate_gbps=rate_gbps),
                          rate=rate, page_cached=round(cached, 3) if cached is not None else None)


def describe_load(*, weights_bytes: int, rate_gbps: float | None) -> str:
    """One line for the panel and pre-flight: size, rate and the expected time."""
    seconds = load_seconds(weights_bytes=weights_bytes, rate_gbps=rate_gbps or 0)
    if seconds is None:
        return f"{weights_bytes / GB:.2f} GB of weights; the disk's read rate is not measured"
    return (f"{weights_bytes / GB:.2f} GB of weights at {rate_gbps:.2f} GB/s: about "
            f"{_duration(seconds)} to read")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def _loaded_bytes(estimate: dict[str, Any], done: dict[str, Any]) -> float | None:
    """The bytes a finished load read: the checkpoint's, else what the log's mem usage
    (GiB on each rank that printed it) adds up to."""
    if estimate.get("bytes"):
        return float(estimate["bytes"])
    usage = done.get("mem_usage_gb")
    return float(usage) * 2**30 * (done.get("ranks") or 1) if usage else None


def _significant(value: float) -> float:
    return float(f"{value:.3g}")


def load_report(*, estimate: dict[str, Any], progress: dict[str, Any]) -> dict[str, Any]:
    """Per model ("weights", "draft_weights"): the expected load and, once the engine has
    loaded it, the GB/s it reached and that rate's share of the disk's measured one.

    estimate is Deployment.load_estimate (bytes, read_gbps, expected_s per model); progress
    the folded weights events (finished, elapsed_s of the slowest rank, mem_usage_gb, ranks).
    """
    report: dict[str, Any] = {}
    for key in ("weights", "draft_weights"):
        expected, done = estimate.get(key) or {}, progress.get(key) or {}
        row: dict[str, Any] = {k: expected.get(k) for k in ("bytes", "read_gbps", "expected_s")}
        size, elapsed = _loaded_bytes(expected, done), done.get("elapsed_s")
        if done.get("finished") and size and elapsed:
            row["elapsed_s"] = elapsed
            # Three significant figures, not decimals: a small checkpoint's rate is not 0.
            row["gbps"] = _significant(size / GB / elapsed)
            if expected.get("read_gbps"):
                row["share"] = _significant(row["gbps"] / expected["read_gbps"])
        if any(v is not None for v in row.values()):
            report[key] = row
    return report


def rate_text(gbps: float) -> str:
    """A rate as the panel writes it: GB/s, or MB/s below 0.1 GB/s, kB/s below 0.1 MB/s and
    bytes/s below 0.1 kB/s (the simulator's tiny checkpoints), never a "0.0" (detail.js the
    same)."""
    if gbps >= 0.1:
        return f"{gbps:.2f} GB/s"
    if gbps >= 1e-4:
        return f"{gbps * 1e3:.1f} MB/s"
    if gbps >= 1e-7:
        return f"{gbps * 1e6:.1f} kB/s"
    return f"{gbps * 1e9:.0f} bytes/s"


def _percent(share: float) -> str:
    return f"{100 * share:.0f} %" if share >= 0.01 else f"{100 * share:.2f} %"


def load_text(row: dict[str, Any]) -> str:
    """One line of the Weights card for a load_report row (detail.js writes the same)."""
    size, rate = row.get("bytes"), row.get("read_gbps")
    if row.get("gbps") is not None:
        text = f"read at {rate_text(row['gbps'])} in {row['elapsed_s']} s"
        if row.get("share") is not None:
            text += f": {_percent(row['share'])} of the disk's measured {rate:.2f} GB/s"
        if row.get("expected_s") is not None:
            text += f" (expected {_duration(row['expected_s'])})"
        return text
    if size and rate:
        return (f"expected load {_duration(row['expected_s'])}: {size / GB:.2f} GB at the "
                f"disk's measured {rate:.2f} GB/s")
    if size:
        return f"{size / GB:.2f} GB to load; the disk's read rate is not measured yet"
    return ""


def measured_load(lines: Iterable[str]) -> dict[str, float]:
    """The weight-load seconds an engine log reports, per model ("weights", "draft_weights"):
    the slowest rank's "Load weight end. elapsed=" (lines as `docker logs -t` or the engine
    printed them)."""

    found: dict[str, float] = {}
    for event in parse_lines(without_docker_stamps(lines)):
        elapsed = event.fields.get("elapsed_s")
        if event.kind != "weights_end" or elapsed is None:
            continue
        key = "draft_weights" if event.fields.get("model") == "draft" else "weights"
        found[key] = max(found.get(key, 0.0), float(elapsed))
    return found


# ---------------------------------------------------------------- command line

EXIT_OK, EXIT_FAILED = 0, 1


def _print(data: dict[str, Any], text: str, as_text: bool) -> None:
    print(text if as_text else json.dumps(data, indent=2))


def cmd_read_rate(args: argparse.Namespace) -> int:
    try:
        rate = measure_read_rate(args.path, max_bytes=int(args.max_gb * GB),
                                 max_seconds=args.max_seconds, threads=args.threads,
                                 direct=False if args.no_direct else None)
    except ReadRateError as exc:
        _print({"error": str(exc)}, f"error: {exc}", args.text)
        return EXIT_FAILED
    line = (f"{rate.gbps:.2f} GB/s: {rate.bytes_read / GB:.2f} GB in {rate.seconds:.2f} s "
            f"from {len(rate.files)} files, {rate.threads} threads, {rate.method}")
    _print(rate.to_dict(), line + (f"\n{rate.note}" if rate.note else ""), args.text)
    return EXIT_OK


def cmd_predict(args: argparse.Namespace) -> int:
    try:
        found = predict_load(args.model_dir, rate_gbps=args.rate_gbps,
                             max_bytes=int(args.max_gb * GB), max_seconds=args.max_seconds)
    except ReadRateError as exc:
        _print({"error": str(exc)}, f"error: {exc}", args.text)
        return EXIT_FAILED
    data, text = found.to_dict(), describe_load(weights_bytes=found.weights_bytes,
                                                 rate_gbps=found.rate_gbps)
    if found.page_cached is not None and found.page_cached >= 0.5:
        text += (f"\n{100 * found.page_cached:.0f} % of these weights are in the page cache: "
                 "an engine loading them now reads RAM, faster than the prediction (drop the "
                 "cache, e.g. echo 1 > /proc/sys/vm/drop_caches, to time the disk)")
    if args.log:
        data, text = _against_log(found, args.log, data, text)
    _print(data, text, args.text)
    return EXIT_OK


def _against_log(found: LoadPrediction, log: str, data: dict[str, Any],
                 text: str) -> tuple[dict[str, Any], str]:
    """The prediction beside the load the engine's log reports (the target's)."""
    with open(log, encoding="utf-8", errors="replace", newline="\n") as handle:
        measured = measured_load(handle).get("weights")
    data = {**data, "measured_s": measured}
    if measured is None:
        return data, f"{text}\nthe log has no target 'Load weight end' line"
    data["measured_gbps"] = round(found.weights_bytes / GB / measured, 3) if measured else None
    data["measured_over_predicted"] = round(measured / found.seconds, 3) \
        if found.seconds else None
    line = f"measured {_duration(measured)} in the engine's log"
    if found.seconds:
        line += f": {measured / found.seconds:.2f} x the prediction"
    return data, f"{text}\n{line}"


def add_parser(sub: Any) -> None:
    """`appliance store read-rate <path>` and `appliance store predict <model dir>`."""
    store = sub.add_parser("store", help="the model store: disk read rate, load-time prediction")
    inner = store.add_subparsers(dest="store_command", required=True)
    for name, help_text, target, func in (
        ("read-rate", "sequential read rate of the weight files under a path (page cache "
         "bypassed)", "path", cmd_read_rate),
        ("predict", "expected weight-load seconds of a model folder from its size and a "
         "read rate (measured on its disk unless --rate-gbps)", "model_dir", cmd_predict),
    ):
        cmd = inner.add_parser(name, help=help_text)
        cmd.add_argument(target)
        cmd.add_argument("--text", action="store_true", help="human-readable text, not JSON")
        cmd.add_argument("--max-gb", type=float, default=DEFAULT_MAX_BYTES / GB,
                         help="read at most this many GB (default %(default).1f)")
        cmd.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS,
                         help="read for at most this long (default %(default).0f)")
        if name == "read-rate":
            cmd.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                             help="reads in flight (default %(default)d)")
            cmd.add_argument("--no-direct", action="store_true",
                             help="drop the page cache with posix_fadvise instead of O_DIRECT")
        else:
            cmd.add_argument("--rate-gbps", type=float, default=None,
                             help="use this read rate instead of measuring one")
            cmd.add_argument("--log", default=None,
                             help="an engine log of this model's load: print the measured "
                             "load beside the prediction")
        cmd.set_defaults(func=func)
