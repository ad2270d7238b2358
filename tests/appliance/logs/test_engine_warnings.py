"""Engine warnings that change what runs become findings (appliance.logs.engine_warnings):
a severity, the values the engine printed quoted, and a fix that says where to change it.

Each line below is the pinned source's format string (433c58ed7, ../shared/sglang-src) with
values filled in, as its logger prints it; the source test checks each format is there."""

from __future__ import annotations

import os
import tarfile
from functools import cache
from pathlib import Path

import pytest

from appliance.logs.diagnosis import diagnose
from appliance.logs.engine_warnings import ENGINE_WARNING_IDS, match_engine_warning
from appliance.logs.parser import LogParser

ROOT = Path(__file__).resolve().parents[3]
SNAPSHOTS = Path(os.environ.get("APPLIANCE_SGLANG_SRC_DIR", ROOT.parent / "shared" / "sglang-src"))
PINNED = SNAPSHOTS / "sglang-433c58ed70cd1dabe5a07a83da12f1513cd599ae.tar.gz"
SRT = "sglang-433c58ed70cd1dabe5a07a83da12f1513cd599ae/python/sglang/srt/"

# (cause, the line, the source file, the format's fixed text, values the finding must quote)
LINES = [
    ("dflash-block-size-mismatch",
     "DFLASH block size mismatch: using speculative_num_draft_tokens=4 but draft config "
     "block_size=8.", "speculative/dflash_worker_v2.py", "DFLASH block size mismatch: using "
     "speculative_num_draft_tokens=%s but draft config block_size=%s.", ("4", "8")),
    ("ddtree-block-size-flag-ignored",
     "DDTREE uses --speculative-ddtree-block-size=16 instead of --speculative-num-draft-tokens=8.",
     "arg_groups/speculative_hook.py", "DDTREE uses --speculative-ddtree-block-size=%d instead",
     ("16", "8")),
    ("ddtree-dflash-block-size-ignored",
     "DDTREE ignores conflicting --speculative-dflash-block-size=8; using "
     "--speculative-ddtree-block-size=16.", "arg_groups/speculative_hook.py",
     "DDTREE ignores conflicting --speculative-dflash-block-size=%s; ", ("8", "16")),
    ("dflash-speculative-param-overridden",
     "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps=3 to 1.",
     "arg_groups/speculative_hook.py", "DFLASH only supports speculative_num_steps == 1; "
     "overriding speculative_num_steps=%s to 1.", ("speculative_num_steps=3",)),
    ("draft-attention-backend-replaced",
     "DFLASH draft worker only supports attention_backend in ('flashinfer', 'fa3', 'fa4', "
     "'triton', 'ascend') for now, but got 'torch_native'. Falling back to 'flashinfer'.",
     "arg_groups/speculative_hook.py", "DFLASH draft worker only supports attention_backend in "
     "%s for now, ", ("flashinfer",)),
    ("draft-attention-backend-replaced",
     "DFLASH draft worker does not support 'trtllm_mha' because the draft path requires "
     "per-layer DFlash attention. Falling back to 'flashinfer'.",
     "arg_groups/speculative_hook.py", "DFLASH draft worker does not support 'trtllm_mha' "
     "because the ", ("flashinfer",)),
    ("draft-cuda-graph-disabled",
     "Disable DFLASH draft cuda graph because only 0.62 GB GPU memory is available after "
     "target backend initialization.", "speculative/dflash_worker_v2.py",
     "Disable DFLASH draft cuda graph because only %.2f GB GPU ", ("0.62 GB",)),
    ("cuda-graph-disabled-by-backend",
     "Cuda graph is disabled because of using torch native attention backend", "server_args.py",
     "Cuda graph is disabled because of using torch native attention backend", ("torch native",)),
    ("max-running-requests-reset",
     "Max running requests is reset to 48 for speculative decoding. You can override this by "
     "explicitly setting --max-running-requests.", "arg_groups/speculative_hook.py",
     "Max running requests is reset to 48 for speculative decoding.", ("48",)),
    ("mixed-chunk-disabled",
     "Mixed chunked prefill is disabled because of using dflash speculative decoding.",
     "arg_groups/speculative_hook.py",
     "Mixed chunked prefill is disabled because of using dflash speculative decoding.",
     ("dflash",)),
    ("overlap-schedule-disabled", "Pipeline parallelism is incompatible with overlap schedule.",
     "arg_groups/overrides.py", "Pipeline parallelism is incompatible with overlap schedule.",
     ()),
    ("speculative-adaptive-disabled",
     "speculative_adaptive disabled: only EAGLE topk=1 is supported. Falling back to static "
     "speculative params.", "arg_groups/speculative_hook.py",
     "Falling back to static speculative params.", ("only EAGLE topk=1 is supported",)),
    ("draft-window-ignored",
     "--speculative-draft-window-size has no effect with speculative_algorithm=EAGLE (honored "
     "by Llama EAGLE-3 and DFLASH only).", "arg_groups/speculative_hook.py",
     "--speculative-draft-window-size has no effect with ", ("EAGLE",)),
    ("ddtree-prepare-block-eager",
     "DDTREE Triton prepare_block failed; using eager path: out of resources",
     "speculative/ddtree_worker_v2.py", "DDTREE Triton prepare_block failed; using eager path",
     ("out of resources",)),
]


@pytest.mark.parametrize(("cause", "line", "values"),
                         [(c, line, v) for c, line, _, _, v in LINES])
def test_each_warning_is_a_finding_that_quotes_the_values_and_says_where_to_fix(
        cause: str, line: str, values: tuple[str, ...]) -> None:
    found = match_engine_warning(line)
    assert found is not None and found.cause == cause
    assert found.severity in ("info", "warning")
    assert all(v in found.summary for v in values), found.summary
    if cause != "ddtree-prepare-block-eager":  # a kernel failure: no setting fixes it
        assert "spec key" in found.fix or "Extra engine arguments" in found.fix, found.fix


def test_the_block_size_mismatch_fix_is_the_drafters_block_size_as_a_patch() -> None:
    found = match_engine_warning(LINES[0][1])
    assert found is not None and found.severity == "warning"
    assert found.patch == {"engine.speculative_num_draft_tokens": 8}
    assert "Block size in the form (spec key engine.speculative_num_draft_tokens), now 4" in \
        found.fix


def test_every_warning_of_the_catalogue_is_tested_here() -> None:
    assert {c for c, *_ in LINES} == ENGINE_WARNING_IDS


def test_a_warning_on_eight_ranks_is_one_finding_and_never_a_failures_cause() -> None:
    parser = LogParser()
    lines = [f"[2026-12-01 10:00:0{r} TP{r}] {LINES[0][1]}" for r in range(8)]
    events = [e for line in lines for e in parser.feed(line)]
    assert [(e.kind, e.fields["cause"], e.fields["fatal"]) for e in events] == [
        ("diagnosis", "dflash-block-size-mismatch", False)]
    assert diagnose(lines) is None


@cache
def _source(path: str) -> str:
    with tarfile.open(PINNED) as tar:
        member = tar.extractfile(SRT + path)
        assert member is not None
        return member.read().decode()


@pytest.mark.skipif(not PINNED.exists(), reason="../shared/sglang-src is absent")
@pytest.mark.parametrize(("path", "text"), sorted({(p, t) for _, _, p, t, _ in LINES}))
def test_each_warnings_format_is_in_the_pinned_source(path: str, text: str) -> None:
    source = _source(path)
    # Formats split over lines in the source ("..." "...") are joined before the search.
    joined = "".join(part.split('"')[1] if part.count('"') >= 2 else part
                     for part in source.splitlines())
    assert text in source or text in joined, (path, text)
