"""The tracebacks the failure modes print, with SGLang's real frames."""

from __future__ import annotations

import os
import sys

from sglang.test_engine.config import Config
from sglang.test_engine.output import log
from sglang.test_engine.settings import SHARDS, SITE, SRT, TOTAL_MEM_GB


def traceback_text(frames: list[tuple[str, int, str, str]], error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        lines.append(f'  File "{path}", line {lineno}, in {func}')
        lines.append(f"    {code}")
    lines.append(error)
    return "\n".join(lines)


def scheduler_crash(cfg: Config, tb: str) -> None:
    """How SGLang reports a dead scheduler: per rank, then the parent's SIGQUIT note."""
    for rank in range(cfg.args.tp_size):
        log(f"Scheduler hit an exception: {tb}\n", rank)
    log("Received sigquit from a child process. It usually means the child failed.")
    sys.stderr.flush()
    os._exit(1)


SCHED_FRAMES = [
    (f"{SRT}/managers/scheduler.py", 3806, "run_scheduler_process",
     "scheduler.event_loop_normal()"),
    (f"{SITE}/torch/utils/_contextlib.py", 120, "decorate_context",
     "return func(*args, **kwargs)"),
    (f"{SRT}/managers/scheduler.py", 1523, "event_loop_normal",
     "result = self.run_batch(batch)"),
    (f"{SRT}/managers/scheduler.py", 2981, "run_batch",
     "batch_result = self.model_worker.forward_batch_generation("),
]


def ddtree_width_traceback(cfg: Config) -> str:
    frames = SCHED_FRAMES + [
        (f"{SRT}/speculative/ddtree_worker.py", 412, "forward_batch_generation",
         "logits_output, can_run_cuda_graph = self.verify(batch, tree)"),
        (f"{SRT}/speculative/ddtree_worker.py", 538, "verify",
         "batch_result = self.target_worker.forward_batch_generation("),
        (f"{SRT}/managers/tp_worker.py", 470, "forward_batch_generation",
         "out = self.model_runner.forward("),
        (f"{SRT}/model_executor/model_runner.py", 3153, "forward",
         "output = self._forward_raw("),
        (f"{SRT}/model_executor/model_runner.py", 3223, "_forward_raw",
         "ret = self.graph_runner.replay("),
        (f"{SRT}/model_executor/cuda_graph_runner.py", 1303, "replay",
         "self.buffers.input_ids[: self.raw_num_token].copy_(forward_batch.input_ids)"),
    ]
    err = (
        f"RuntimeError: The size of tensor a ({cfg.block}) must match the size of tensor b "
        f"({cfg.verify_width}) at non-singleton dimension 0"
    )
    return traceback_text(frames, err)


def capture_oom_traceback(rank: int) -> str:
    init = [
        (f"{SRT}/managers/scheduler.py", 3790, "run_scheduler_process",
         "scheduler = Scheduler("),
        (f"{SRT}/managers/scheduler.py", 402, "__init__", "self.init_model_worker()"),
        (f"{SRT}/managers/tp_worker.py", 246, "__init__", "self._init_model_runner()"),
        (f"{SRT}/model_executor/model_runner.py", 418, "__init__",
         "self.initialize(min_per_gpu_memory)"),
        (f"{SRT}/model_executor/model_runner.py", 612, "initialize", "self.init_device_graphs()"),
        (f"{SRT}/model_executor/model_runner.py", 2788, "init_device_graphs",
         "self.graph_runner = graph_runners[self.device](self)"),
    ]
    inner = traceback_text(
        [
            (f"{SRT}/model_executor/cuda_graph_runner.py", 598, "__init__", "self.capture()"),
            (f"{SRT}/model_executor/cuda_graph_runner.py", 881, "capture",
             ") = self.capture_one_batch_size(bs, forward, stream_idx)"),
            (f"{SRT}/model_executor/cuda_graph_runner.py", 1042, "capture_one_batch_size",
             "run_once()"),
            (f"{SITE}/torch/cuda/graphs.py", 186, "__exit__", "self.cuda_graph.capture_end()"),
        ],
        oom_message(rank, prefix="torch.OutOfMemoryError: "),
    )
    outer = traceback_text(
        init + [(f"{SRT}/model_executor/cuda_graph_runner.py", 600, "__init__",
                 "raise Exception(")],
        f"Exception: Capture cuda graph failed: {oom_message(rank)}\n"
        "Possible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
        "3. disable torch compile by not using --enable-torch-compile\n"
        "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n",
    )
    during = "\n\nDuring handling of the above exception, another exception occurred:\n\n"
    return inner + during + outer


def oom_message(rank: int, prefix: str = "") -> str:
    return (
        f"{prefix}CUDA out of memory. Tried to allocate 2.00 GiB. GPU {rank} has a total "
        f"capacity of {TOTAL_MEM_GB:.2f} GiB of which 1.12 GiB is free. Including non-PyTorch "
        "memory, this process has 138.68 GiB memory in use. Of the allocated memory 130.20 GiB "
        "is allocated by PyTorch, and 1.45 GiB is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def load_exit_traceback(cfg: Config, shard: int) -> str:
    path = f"{cfg.args.model_path}/model-{shard:05d}-of-{SHARDS:05d}.safetensors"
    frames = [
        (f"{SRT}/managers/scheduler.py", 3790, "run_scheduler_process", "scheduler = Scheduler("),
        (f"{SRT}/managers/scheduler.py", 402, "__init__", "self.init_model_worker()"),
        (f"{SRT}/managers/tp_worker.py", 246, "__init__", "self._init_model_runner()"),
        (f"{SRT}/model_executor/model_runner.py", 418, "__init__",
         "self.initialize(min_per_gpu_memory)"),
        (f"{SRT}/model_executor/model_runner.py", 540, "initialize", "self.load_model()"),
        (f"{SRT}/model_executor/model_runner.py", 1420, "load_model",
         "self.model = get_model("),
        (f"{SRT}/model_loader/loader.py", 687, "load_model",
         "self.load_weights_and_postprocess("),
        (f"{SRT}/model_loader/weight_utils.py", 884, "safetensors_weights_iterator",
         'with safetensors.safe_open(st_file, framework="pt", device="cpu") as f:'),
    ]
    return traceback_text(
        frames,
        "safetensors_rust.SafetensorError: Error while deserializing header: "
        f"MetadataIncompleteBuffer (file {path})",
    )


def model_missing_exit(cfg: Config) -> None:
    """An engine that exits at once: transformers cannot find the model's config.json (the
    message transformers' configuration_utils prints when launch_server reads the config)."""
    path = cfg.args.model_path
    frames = [
        (f"{SITE}/sglang/launch_server.py", 29, "<module>", "server_args = prepare_server_args("
         "sys.argv[1:])"),
        (f"{SRT}/server_args.py", 4702, "prepare_server_args",
         "return ServerArgs.from_cli_args(raw_args)"),
        (f"{SITE}/transformers/configuration_utils.py", 721, "_get_config_dict",
         "resolved_config_file = cached_file("),
    ]
    error = (f"OSError: {path} does not appear to have a file named config.json. Checkout "
             f"'https://huggingface.co/{path}/tree/None' for available files.")
    sys.stderr.write(traceback_text(frames, error) + "\n")
    sys.stderr.flush()
    os._exit(1)
