"""Tune: which of no speculation, DFLASH and DDTREE budgets is fastest, and lossless, for an
operator's prompts and concurrencies; framework-free (no Django). The panel's service, the
bench (bench/tune.py) and a GPU rig drive the same `run_tune` through a `Deployer` of their
own: the deployment's row on the panel, paced engines in the bench, the rig's engines.
"""

from appliance.tune.candidates import (
    BASELINE,
    Candidate,
    CandidateError,
    candidate_spec,
    default_candidates,
    parse_candidates,
)
from appliance.tune.recommend import recommend
from appliance.tune.run import (
    Deployer,
    DeployFailed,
    TuneCancelled,
    TuneOptions,
    TuneProgress,
    TuneResult,
    run_tune,
)

__all__ = [
    "BASELINE", "Candidate", "CandidateError", "DeployFailed", "Deployer", "TuneCancelled",
    "TuneOptions", "TuneProgress", "TuneResult", "candidate_spec", "default_candidates",
    "parse_candidates", "recommend", "run_tune",
]
