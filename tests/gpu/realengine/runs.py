"""The rig's runs: what each starts, changes and expects, and the prompts it sends."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.bench.verify import BUILTIN_PROMPTS

S433 = "sglang-433c58ed70cd1dabe5a07a83da12f1513cd599ae"
S101 = "sglang-101cd5bd02faab336ada94f78daada6288c1816e"
# The PyPI release the DFLASH and baseline recipes pin: site523/ (build_carry.py --release).
R523 = "sglang-0.5.23"
TRITON = {"--attention-backend": "triton"}
NO_SPECULATION = {"engine.speculative_algorithm": "NONE", "engine.speculative_draft_model_path": None,
                  "engine.speculative_num_draft_tokens": None, "engine.speculative_ddtree_budget": None}
CAPTURED = "Capture draft verify CUDA graph end"
COMPANION_PORT = 30001
INT4 = {"engine.model_path": "{models}/tiny-kimi-int4"}


@dataclass(frozen=True)
class Run:
    name: str
    about: str
    example: str  # "ddtree" | "dflash": examples/kimi-<example>.yaml
    source: str = S433
    spec_overrides: dict[str, object] = field(default_factory=dict)
    argv_overrides: dict[str, str | None] = field(default_factory=dict)
    drop_flags: tuple[str, ...] = ()
    expect: str = "ready"  # "ready" | "failure"
    serve: bool = True  # after ready: idle, requests, bench, idle
    stop_after: str | None = None  # a failure run stops once this text appears (or on exit)
    start_timeout: float = 420
    bench_levels: tuple[int, ...] = (1, 8, 32)
    self_check: bool = True
    # Another run started first on COMPANION_PORT and kept up while this one serves: after
    # the probe, `appliance verify` runs this engine (A) against it (B).
    companion: str | None = None
    # Before the engine starts: the product's read-rate and load-time prediction on the
    # model's folder, page cache evicted first (the prediction held against the measured load).
    predict_load: bool = False
    probe: bool = True  # serve: the log-prob probe on the product's verify prompts
    # serve: what the engine answers to requests a speculative engine may refuse (grammar,
    # tools, log-probs, n, stop strings, prompts at the context length): refusals.json.
    refusals: bool = False
    grammar: bool = False  # xgrammar carried: the product's grammar backend, not `none`
    # Served alone: while this run probes and benches, no other run of its wave does (the
    # rig's serve lock), so its speed is not another engine's load.
    exclusive_serve: bool = False
    # serve: the bench's prompts (a JSONL file, `{models}` expanded) instead of its synthetic
    # words, and the tokens asked for each.
    bench_prompts: str | None = None
    bench_output_len: int = 64
    # Seconds its serving takes where the default estimate (serve_s) is far off.
    serve_estimate_s: float | None = None
    # Environment the engine gets beyond the product's: name -> (value, why), in run.json.
    env: dict[str, tuple[str, str]] = field(default_factory=dict)
    # What the rig gives the engine beyond the product's image (a stub, a carried header), each
    # with why: appended to run.json's changes.
    notes: tuple[str, ...] = ()

    @property
    def paths(self) -> dict[str, str]:
        return {"src": f"{self.source}/python"}

    @property
    def pythonpath(self) -> tuple[str, ...]:
        if self.source == R523:
            # The release's own packages (sglang among them) and the stubs, alone.
            return ("site523", "stubs523")
        if self.source == S101:
            # 101cd5bd0 imports moe_fused_gate (sglang-kernel 0.4.3) and flashinfer.gemm.
            return ("stubs101", "site101", "site", "stubs", "{src}")
        return ("site", "stubs", "{src}")


def _runs(*runs: Run) -> dict[str, Run]:
    return {run.name: run for run in runs}


RUNS = _runs(
    Run("ddtree_triton", "DDTREE (budget 32, block 8) with triton, the Blackwell path", "ddtree",
        argv_overrides=TRITON),
    Run("dflash_triton", "DFLASH (block 8) with triton", "dflash", argv_overrides=TRITON,
        self_check=False),
    Run("base_triton", "no speculation, the autoregressive baseline, triton", "ddtree",
        spec_overrides=NO_SPECULATION, argv_overrides=TRITON, self_check=False),
    # fa3, the recipe's backend on Hopper: the product's argv unchanged but for the model
    # paths (flash_ops sliced to its bf16 sm_90 kernels so that it travels; README.md).
    Run("ddtree_fa3", "DDTREE with fa3 and page size 1, exactly as the recipe", "ddtree",
        bench_levels=(1, 8, 32)),
    Run("dflash_fa3", "DFLASH with the product's argv (the engine's default backend)", "dflash",
        self_check=False, bench_levels=(1, 8, 32)),
    # The losslessness probe alone (the first runs' speculative probes were refused log-probs).
    Run("ddtree_probe", "DDTREE triton: the probe prompts, no bench", "ddtree",
        argv_overrides=TRITON, bench_levels=()),
    Run("dflash_probe", "DFLASH triton: the probe prompts, no bench", "dflash",
        argv_overrides=TRITON, bench_levels=(), self_check=False),
    # The losslessness check as the product runs it: `appliance verify` between DDTREE (A) and
    # the baseline (B), both up at once on the one GPU (memory split between them).
    Run("base_companion", "no speculation, triton: the baseline B for verify_ddtree_base",
        "ddtree", spec_overrides={**NO_SPECULATION, "engine.mem_fraction_static": 0.3},
        argv_overrides={**TRITON, "--port": "30001"}, serve=False, self_check=False),
    Run("verify_ddtree_base", "DDTREE triton (A) verified against no speculation (B)", "ddtree",
        spec_overrides={"engine.mem_fraction_static": 0.45}, argv_overrides=TRITON,
        bench_levels=(), self_check=False, companion="base_companion"),
    Run("base_fa3_companion", "no speculation, the engine's default backend (fa3): B for "
        "verify_dflash_fa3", "dflash", spec_overrides={**NO_SPECULATION, "engine.mem_fraction_static": 0.3},
        argv_overrides={"--port": "30001"}, serve=False, self_check=False),
    Run("verify_dflash_fa3", "DFLASH on fa3 (A) verified against no speculation on fa3 (B)",
        "dflash", spec_overrides={"engine.mem_fraction_static": 0.45}, bench_levels=(),
        self_check=False, companion="base_fa3_companion"),
    Run("verify_ddtree_fa3", "DDTREE with the recipe's fa3 (A) verified against no speculation "
        "on fa3 (B)", "ddtree", spec_overrides={"engine.mem_fraction_static": 0.45},
        bench_levels=(), self_check=False, companion="base_fa3_companion"),
    # A model of several GB (big-kimi, 5.7 GB in 8 shards): its load time predicted by the
    # product from size and the disk's measured read rate, then measured from the real log.
    Run("bigload_triton", "no speculation, triton, big-kimi from a cold page cache", "ddtree",
        spec_overrides={**NO_SPECULATION, "engine.model_path": "{models}/big-kimi"},
        argv_overrides=TRITON, serve=False, self_check=False, predict_load=True,
        start_timeout=300),
    # Failures, each recorded for the diagnosis catalogue.
    Run("ddtree101_triton", "101cd5bd0 (the PR head) crashes at the target verify capture",
        "ddtree", source=S101, argv_overrides={**TRITON, "--disable-overlap-schedule": None},
        expect="failure", start_timeout=200, self_check=False),
    Run("missing_model", "the model path does not exist", "ddtree", argv_overrides=TRITON,
        spec_overrides={"engine.model_path": "/models/Kimi-K2.7-typo"}, expect="failure",
        start_timeout=120, self_check=False),
    Run("drafter_hidden_mismatch", "a drafter trained for a target of hidden size 384",
        "ddtree", argv_overrides=TRITON, expect="failure", start_timeout=200, self_check=False,
        spec_overrides={"engine.speculative_draft_model_path": "{models}/tiny-kimi-dflash-h384"}),
    Run("capture_oom", "CUDA-graph capture out of memory (mem_fraction_static 0.97)", "ddtree",
        argv_overrides=TRITON, spec_overrides={"engine.mem_fraction_static": 0.97},
        expect="failure", start_timeout=240, self_check=False),
    # The drafter's own backend stays triton: left to its default it is flashinfer, which the
    # rig does not carry (the first try failed on the stub, not on the tree).
    Run("tree_backend_unsupported", "DDTREE on a target backend that cannot verify a tree",
        "ddtree", argv_overrides={"--attention-backend": "torch_native",
                                  "--speculative-draft-attention-backend": "triton"},
        expect="failure", start_timeout=240, self_check=False),
    Run("kv_too_small", "no memory left for the KV cache (mem_fraction_static 0.001)", "ddtree",
        argv_overrides=TRITON, spec_overrides={"engine.mem_fraction_static": 0.001},
        expect="failure", start_timeout=150, self_check=False),
    # The second round's failures and warnings (what the appliance misread).
    Run("drafter_missing", "the drafter's path does not exist (the target's is fine)", "ddtree",
        argv_overrides=TRITON, expect="failure", start_timeout=120, self_check=False,
        spec_overrides={"engine.speculative_draft_model_path": "/models/Kimi-K2.6-DFlash-typo"}),
    Run("tp2_one_gpu", "TP2 on GPUs [0, 1] where one GPU is visible", "ddtree",
        argv_overrides=TRITON, expect="failure", start_timeout=180,
        spec_overrides={"gpus": [0, 1], "engine.tp_size": 2}),
    Run("dflash_block4", "DFLASH with 4 draft tokens on a drafter trained at block size 8",
        "dflash", argv_overrides=TRITON, self_check=False, bench_levels=(1, 8),
        spec_overrides={"engine.speculative_num_draft_tokens": 4}),
    Run("ddtree_nograph", "DDTREE with CUDA graphs disabled by the spec", "ddtree",
        argv_overrides=TRITON, self_check=False, bench_levels=(1, 8),
        spec_overrides={"engine.disable_cuda_graph": True}),
    Run("ddtree_bs4_load", "DDTREE, cuda_graph_max_bs 4, under load at 8 and 32 (batches above "
        "the captured sizes)", "ddtree", argv_overrides=TRITON, self_check=False,
        probe=False, spec_overrides={"engine.cuda_graph_max_bs": 4}),
    # What each mode answers to the requests the gateway may have to route elsewhere.
    Run("refusals_ddtree", "DDTREE triton with xgrammar: the refusal requests", "ddtree",
        argv_overrides=TRITON, self_check=False, probe=False, bench_levels=(), refusals=True,
        grammar=True),
    Run("refusals_dflash", "DFLASH triton with xgrammar: the refusal requests", "dflash",
        argv_overrides=TRITON, self_check=False, probe=False, bench_levels=(), refusals=True,
        grammar=True),
    Run("refusals_base", "no speculation, triton, with xgrammar: the refusal requests", "ddtree",
        spec_overrides=NO_SPECULATION, argv_overrides=TRITON, self_check=False, probe=False,
        bench_levels=(), refusals=True, grammar=True),
    # Kimi K2.6's own checkpoint format: routed experts INT4 (compressed-tensors), which
    # take the Marlin MoE kernels, under CUDA graphs at verify width 33 for DDTREE.
    Run("ddtree_int4", "DDTREE triton on the INT4 target (K2.6's checkpoint format)", "ddtree",
        argv_overrides=TRITON, spec_overrides=INT4, refusals=True, grammar=True,
        exclusive_serve=True),
    Run("dflash_int4", "DFLASH triton on the INT4 target", "dflash", argv_overrides=TRITON,
        spec_overrides=INT4, self_check=False, refusals=True, grammar=True, exclusive_serve=True),
    Run("base_int4", "no speculation, triton, on the INT4 target", "ddtree",
        spec_overrides={**NO_SPECULATION, **INT4}, argv_overrides=TRITON, self_check=False,
        refusals=True, grammar=True, exclusive_serve=True),
    # Alone on the GPU, capture only: each graph's memory without another engine's in it (a
    # capture's "mem usage" is the device's free memory before less after). The first on a
    # fresh host builds the Marlin JIT kernels at its own start, as a first INT4 deployment does.
    Run("dflash_int4_alone", "DFLASH triton on the INT4 target, alone, JIT kernels built at "
        "its start", "dflash", argv_overrides=TRITON, spec_overrides=INT4, serve=False,
        self_check=False),
    Run("base_int4_alone", "no speculation, triton, on the INT4 target, alone", "ddtree",
        spec_overrides={**NO_SPECULATION, **INT4}, argv_overrides=TRITON, serve=False,
        self_check=False, start_timeout=200),
    # Memory calibration: capture at other batch-size limits and context lengths, then stop.
    Run("ddtree_triton_bs16", "DDTREE triton, cuda_graph_max_bs 16", "ddtree",
        argv_overrides=TRITON, spec_overrides={"engine.cuda_graph_max_bs": 16}, serve=False,
        start_timeout=200, self_check=False),
    Run("ddtree_triton_ctx32k", "DDTREE triton, context_length 32768", "ddtree",
        argv_overrides=TRITON, spec_overrides={"engine.context_length": 32768}, serve=False,
        start_timeout=200, self_check=False),
    Run("dflash_triton_bs16", "DFLASH triton, cuda_graph_max_bs 16", "dflash",
        argv_overrides=TRITON, spec_overrides={"engine.cuda_graph_max_bs": 16}, serve=False,
        start_timeout=200, self_check=False),
)

# The trained pair (train_pair.py, written on the host by the `trained` phase): a Qwen3 target
# of 32 layers and its 3-layer DFlash drafter (block 8). Each run served alone (its speed is
# the point), benched on prompts cut from held-out Python files at concurrency 1, 4, 16, 32.
# Changes from the product's argv: triton (the Blackwell path, as the other recordings);
# --disable-prefill-cuda-graph (433c58ed7 captures a prefill graph of 58 sizes for a Qwen3
# target otherwise, its first size over 25 s); CUDA graphs up to batch 32 (the highest
# concurrency benched; fewer sizes to capture); a KV pool of 65,536 tokens (ten engines start
# at once on the one GPU; a bench level needs at most 32 x 384).
TRAINED_ARGV = {**TRITON, "--disable-prefill-cuda-graph": None, "--max-total-tokens": "65536"}
TRAINED = {"engine.model_path": "{models}/trained-target",
           "engine.speculative_draft_model_path": "{models}/trained-dflash",
           "engine.cuda_graph_max_bs": 32}
TRAINED_BENCH = {"bench_levels": (1, 4, 16, 32), "bench_prompts": "{models}/trained-target/heldout.jsonl",
                 "bench_output_len": 128, "exclusive_serve": True, "self_check": False,
                 "serve_estimate_s": 45.0}


def _trained(name: str, about: str, example: str, spec: dict[str, object], **extra: object) -> Run:
    options: dict[str, object] = {**TRAINED_BENCH, **extra}
    return Run(name, about, example, spec_overrides={**TRAINED, **spec},
               argv_overrides=dict(TRAINED_ARGV), **options)  # type: ignore[arg-type]


RUNS.update(_runs(
    _trained("trained_base", "no speculation on the trained target (the baseline)", "ddtree",
             NO_SPECULATION),
    _trained("trained_dflash", "DFLASH (block 8) on the trained pair", "dflash", {}),
    _trained("trained_ddtree_b8", "DDTREE budget 8 (block 8) on the trained pair", "ddtree",
             {"engine.speculative_ddtree_budget": 8}),
    _trained("trained_ddtree_b16", "DDTREE budget 16 (block 8) on the trained pair", "ddtree",
             {"engine.speculative_ddtree_budget": 16}),
    _trained("trained_ddtree_b32", "DDTREE budget 32 (block 8) on the trained pair", "ddtree",
             {"engine.speculative_ddtree_budget": 32}),
    _trained("trained_wrong", "DFLASH: the trained drafter on a target it was not trained for "
             "(trained-target-b, same shape, other seed and files)", "dflash",
             {"engine.model_path": "{models}/trained-target-b"}, bench_levels=(1, 4)),
    # The losslessness check as the product runs it, A against no speculation (B), each pair
    # up at once and done before the speed runs serve.
    _trained("trained_base_companion", "no speculation on the trained target: B for the "
             "trained verify runs", "ddtree", {**NO_SPECULATION, "engine.mem_fraction_static": 0.3},
             serve=False, exclusive_serve=False),
    _trained("trained_verify_dflash", "DFLASH on the trained pair (A) verified against no "
             "speculation (B)", "dflash", {}, bench_levels=(), exclusive_serve=False,
             companion="trained_base_companion", serve_estimate_s=40.0),
    _trained("trained_verify_ddtree", "DDTREE budget 16 on the trained pair (A) verified "
             "against no speculation (B)", "ddtree", {"engine.speculative_ddtree_budget": 16},
             bench_levels=(), exclusive_serve=False, companion="trained_base_companion",
             serve_estimate_s=40.0),
))
# What sglang 0.5.23 answers to the refusal set, DFLASH on the tiny Kimi-shaped model and on
# the trained pair (train_pair.py). The host's torch is 2.11.0 and the release's lock pins
# 2.14.1, which cannot travel; the carry's sglang-kernel is 0.4.5, the one built for that torch
# (build_carry.py says why), so 0.5.23's own check for 0.4.9 or later is skipped.
R523_ENV = {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": (
    "1", "sglang-kernel 0.4.5 (built for the host's torch 2.11.0) instead of the lock's 0.4.10 "
    "(built for torch 2.14.1, whose C++ ABI the host lacks); torch 2.11.0 and triton 3.6.0 are "
    "the host's, not the lock's 2.14.1 and 3.8.0")}
TRAINED_523 = {k: v for k, v in TRAINED.items() if k != "engine.cuda_graph_max_bs"}
R523_NOTES = (
    "flashinfer: the rig's stub package with flashinfer-python 0.7.2's JIT headers (data/include, "
    "csrc's headers, cutlass and spdlog includes) for the DFLASH sampling prewarm's nvcc build of "
    "tree_speculative_sampling_target_only; nvcc is the host's, not the lock's 13.5",
    "cutlass: the rig's stub of the CUTLASS DSL (nvidia-cutlass-dsl 4.8.0, 50 MB xz'd, does not "
    "travel): a bf16 Qwen3 MLP imports it, its dual GEMM runs only on SM100; any use raises",
)
R523_REFUSALS = {"source": R523, "self_check": False, "probe": False, "bench_levels": (),
                 "refusals": True, "grammar": True, "env": R523_ENV, "notes": R523_NOTES}
RUNS.update(_runs(
    # Context 32768, not the model's 262144: 433c58ed7's long_fits prefill of 262,044 tokens
    # took 120 s, which one device call with the pair's training has no room for; the answers
    # at the context's edge (long_fits, long_over) are asked at this context's edge instead.
    Run("refusals523_dflash", "DFLASH (block 8) on sglang 0.5.23, triton, with xgrammar, on the "
        "tiny Kimi-shaped model (context 32768): the refusal requests", "dflash",
        argv_overrides=dict(TRITON), spec_overrides={"engine.context_length": 32768},
        **R523_REFUSALS),  # type: ignore[arg-type]
    # 0.5.23 split --cuda-graph-max-bs into -decode and -prefill: its argparse refuses the old
    # flag as ambiguous (recorded 2026-12-06), so the trained pair's limit goes by the new name.
    Run("refusals523_trained", "DFLASH (block 8) on sglang 0.5.23, triton, with xgrammar, on the "
        "trained pair: the refusal requests", "dflash", spec_overrides=dict(TRAINED_523),
        argv_overrides={**TRAINED_ARGV, "--cuda-graph-max-bs-decode": "32"},
        **R523_REFUSALS),  # type: ignore[arg-type]
))
RUNS.update(_runs(
    # The baseline (no speculation) beside them: what the release serves without a speculative
    # mode, so that a refusal is the mode's and not the release's.
    Run("refusals523_base", "no speculation on sglang 0.5.23, triton, with xgrammar, on the "
        "tiny Kimi-shaped model (context 32768): the refusal requests", "dflash",
        argv_overrides=dict(TRITON),
        spec_overrides={**NO_SPECULATION, "engine.context_length": 32768},
        **R523_REFUSALS),  # type: ignore[arg-type]
))
R523_RUNS = ("refusals523_dflash", "refusals523_trained", "refusals523_base")
TRAINED_RUNS = ("trained_base", "trained_dflash", "trained_ddtree_b8", "trained_ddtree_b16",
                "trained_ddtree_b32", "trained_wrong", "trained_verify_dflash",
                "trained_verify_ddtree")

# The product's own verify prompts: at temperature 0 with the top-2 log-probs they show where
# two runs part and how close the baseline's top two were there.
PROBE_PROMPTS = BUILTIN_PROMPTS


def estimate_s(run: Run) -> float:
    """Seconds a run needs, start to stop, on a warm machine (from the recorded runs' times),
    serving alone; an exclusive run's serving comes after the others' (see wave_min_s)."""
    if run.expect == "failure":
        return min(run.start_timeout, 150) + 35
    return 150 + serve_s(run) + 35


def serve_s(run: Run) -> float:
    if not run.serve:
        return 0
    if run.serve_estimate_s is not None:
        return run.serve_estimate_s
    # idle before and after, the streams; the probe; a bench level; the refusals (long prompts)
    return 25 + (20 if run.probe else 0) + 8 * len(run.bench_levels) + (25 if run.refusals else 0)


def wave_min_s(names: list[str]) -> float:
    """The least time left at which a wave of runs started together can finish."""
    runs = [RUNS[name] for name in names]
    alone = max((estimate_s(run) for run in runs if not run.exclusive_serve), default=0)
    exclusive = [run for run in runs if run.exclusive_serve]
    if not exclusive:
        return alone
    return max(alone, 150) + sum(serve_s(run) for run in exclusive) + 35


if __name__ == "__main__":
    import sys

    # `runs.py --wave-min a,b,c`: real-engine.sh asks before it starts a wave.
    print(int(wave_min_s(sys.argv[2].split(","))))
