"""Writing to the streams: logging lines (stderr, SGLang's format) and tqdm bars."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from sglang.test_engine import engine  # its CFG: set by launch_server.main() before any line
from sglang.test_engine.config import Config
from sglang.test_engine.settings import PACE_S

_out_lock = threading.Lock()


def now_str() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def emit(stream: Any, text: str) -> None:
    with _out_lock:
        stream.write(text)
        stream.flush()


def log(msg: str, rank: int | None = None, pace: bool = True) -> None:
    """One logging line as SGLang's configure_logger formats it (stderr). The scheduler's
    ` TPn` is there only when tp_size > 1 (433c58ed7 scheduler.py; the recordings at TP1
    have none)."""
    shown = rank is not None and engine.CFG.args.tp_size > 1
    prefix = f" TP{rank}" if shown else ""
    emit(sys.stderr, f"[{now_str()}{prefix}] {msg}\n")
    if pace:
        time.sleep(PACE_S)


def uvicorn_line(stream: Any, msg: str) -> None:
    """uvicorn's own lines with SGLang's format (utils/common.py set_uvicorn_logging_configs:
    `[%(asctime)s] %(levelprefix)s ...`): startup on stderr, access on stdout."""
    emit(stream, f"[{now_str()}] INFO:     {msg}\n")


def log_ranks(cfg: Config, msg_for_rank: Any) -> None:
    """A line every TP rank's scheduler process prints."""
    for rank in range(cfg.args.tp_size):
        log(msg_for_rank(rank), rank)


def fmt_clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


def fmt_rate(sec_per_it: float) -> str:
    if sec_per_it <= 0:
        return "?it/s"
    if sec_per_it >= 1:
        return f"{sec_per_it:5.2f}s/it"
    return f"{1 / sec_per_it:5.2f}it/s"


class Bar:
    """tqdm on stderr: every refresh starts with '\\r', close ends the line with '\\n'."""

    def __init__(self, total: int, desc: str = "", sglang_format: bool = False) -> None:
        self.total, self.n, self.desc = total, 0, desc
        self.sglang_format = sglang_format
        self.sec_per_it = 0.0
        self.last_len = 0
        self.refresh()

    def render(self) -> str:
        pct = 100 * self.n / self.total if self.total else 100
        elapsed = self.n * self.sec_per_it
        remaining = (self.total - self.n) * self.sec_per_it
        times = (
            f"[{fmt_clock(elapsed)}<{fmt_clock(remaining)}, {fmt_rate(self.sec_per_it)}]"
            if self.n
            else "[00:00<?, ?it/s]"
        )
        if self.sglang_format:  # sglang.srt.utils.common.BAR_FORMAT
            return f"{self.desc}: {pct:3.0f}% Completed | {self.n}/{self.total} {times}"
        filled = int(10 * self.n / self.total) if self.total else 10
        bar = ("█" * filled).ljust(10)
        head = f"{self.desc}: " if self.desc else ""
        return f"{head}{pct:3.0f}%|{bar}| {self.n}/{self.total} {times}"

    def refresh(self) -> None:
        text = self.render()
        emit(sys.stderr, "\r" + text + " " * max(self.last_len - len(text), 0))
        self.last_len = len(text)

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self.refresh()

    def update(self, sec_per_it: float) -> None:
        self.n += 1
        self.sec_per_it = sec_per_it
        self.refresh()

    def close(self) -> None:
        emit(sys.stderr, "\n")
