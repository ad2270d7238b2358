"""The benchmark client: an async streaming client for OpenAI-compatible servers.

Figures are defined as `sglang.bench_serving` defines them (TTFT, TPOT, ITL per chunk,
output throughput over the level's wall time), so results can be compared with it.
Framework-free: plain dataclasses in and out; the panel's service and the CLI sit on top.
"""

from appliance.bench.metrics import LevelMetrics, Stats, level_metrics
from appliance.bench.prompts import Prompt, PromptError, load_prompts
from appliance.bench.runner import (
    BenchOptions,
    Progress,
    RunResult,
    StepResult,
    Target,
    plan_steps,
    run_benchmark,
    speedups,
)

__all__ = [
    "BenchOptions", "LevelMetrics", "Progress", "Prompt", "PromptError", "RunResult",
    "StepResult", "Stats", "Target", "level_metrics", "load_prompts", "plan_steps",
    "run_benchmark", "speedups",
]
