"""GPU self-check run inside the engine container before the model loads.

A DDTree deployment that is mis-sized (wrong driver, dead peer links, a CUDA graph
captured at the wrong width) otherwise fails only after the ~6 minute load of a
590 GB model. This package finds those faults in seconds and prints JSON.

torch and pynvml are imported lazily: the appliance (web, worker, CI) imports
this package on machines without either, and a missing one must become a failed
check with a fix, never a traceback.

Usage:
    python -m appliance.selfcheck --gpus 0,1 --algorithm DDTREE --block-size 8 --budget 32 --json

With --stream (what the engine entrypoint uses) every check is printed the moment it
finishes, one line each, `gpu-check: {json}`: a `begin` line, one `check` line per check,
then one `report` line with the whole report. The worker's log parser reads these lines,
so the panel shows the self-check as it runs; STREAM_PREFIX is the contract between them.

Modules: report (the report, graph roles, stream lines), inventory (lazy imports,
driver, NVML inventory), links (topology, peer access, NCCL all-reduce), graphs
(CUDA-graph capture and replay, the width-mismatch reproduction), cli (run_check,
the command line).
"""

from .cli import Options, build_parser, main, roles_from_args, run_check
from .graphs import (
    GRAPH_HEADS,
    GRAPH_HIDDEN,
    GRAPH_PREFIX,
    GRAPH_TOLERANCE,
    CapturedGraph,
    VerifyBlock,
    make_mask,
    mask_rows,
    reproduce_width_mismatch,
    run_graph_role,
    tree_parents,
    width_mismatch_traceback,
)
from .inventory import (
    MIN_DRIVER_MAJOR,
    check_driver,
    format_cuda_version,
    nvml_inventory,
    parse_driver_version,
    parse_gpu_list,
    visible_device_ids,
)
from .links import (
    ALLREDUCE_TIMEOUT_S,
    DEFAULT_ALLREDUCE_MB,
    NVLINK_MAX_LINKS,
    TOPOLOGY_NAMES,
    bus_bandwidth,
    nvml_topology,
    peer_access,
    run_allreduce,
)
from .report import (
    ALGORITHMS,
    STREAM_PREFIX,
    Check,
    GraphRole,
    Report,
    capture_batch_sizes,
    explicit_roles,
    graph_roles,
    parse_stream_line,
    stream_line,
    summarize,
)

__all__ = [
    # report
    "ALGORITHMS",
    "STREAM_PREFIX",
    "Check",
    "GraphRole",
    "Report",
    "capture_batch_sizes",
    "explicit_roles",
    "graph_roles",
    "parse_stream_line",
    "stream_line",
    "summarize",
    # inventory
    "MIN_DRIVER_MAJOR",
    "check_driver",
    "format_cuda_version",
    "nvml_inventory",
    "parse_driver_version",
    "parse_gpu_list",
    "visible_device_ids",
    # links
    "ALLREDUCE_TIMEOUT_S",
    "DEFAULT_ALLREDUCE_MB",
    "NVLINK_MAX_LINKS",
    "TOPOLOGY_NAMES",
    "bus_bandwidth",
    "nvml_topology",
    "peer_access",
    "run_allreduce",
    # graphs
    "GRAPH_HEADS",
    "GRAPH_HIDDEN",
    "GRAPH_PREFIX",
    "GRAPH_TOLERANCE",
    "CapturedGraph",
    "VerifyBlock",
    "make_mask",
    "mask_rows",
    "reproduce_width_mismatch",
    "run_graph_role",
    "tree_parents",
    "width_mismatch_traceback",
    # cli
    "Options",
    "build_parser",
    "main",
    "roles_from_args",
    "run_check",
]
