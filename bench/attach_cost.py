"""What the agent's bar stream costs per line: a container prints SGLang decode lines at a
paced rate, read once as the follower reads every engine (`docker logs --follow` with
timestamps: appliance.runtime.logstream.log_frames) and once more with the attach stream
the follower reads for a tqdm bar's pieces (attach_frames, lines_of with partials), the
two readers on threads of this process. Figures per run: dockerd's CPU per line (from
/proc, its whole process: anything else Docker does meanwhile counts too) and this
process's (the readers' parsing), and the ratio of each with the attach to without.

Before the engine is ready the follower reads both (bars are drawn while weights load and
graphs are captured); from ready on, the log stream alone (appliance/runtime/follower.py).

    .venv/bin/python bench/attach_cost.py --lines 150000 --rate 10000
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from docker.client import DockerClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(client: DockerClient, image: str, lines: int, rate: float,
        attach: bool) -> dict[str, float]:
    from appliance.runtime.logstream import attach_frames, lines_of, log_frames
    from bench.log_path import PRINTER

    api = client.api
    container = client.containers.run(
        image, ["python3", "-c", PRINTER, str(lines), str(rate), "decode"], detach=True)
    counts = {"logs": 0, "attach": 0}

    def read(kind: str, frames: Iterator[tuple[int, bytes]]) -> None:
        for _ in lines_of(frames, partials=kind == "attach", timestamps=kind == "logs"):
            counts[kind] += 1

    readers = [threading.Thread(target=read, args=(
        "logs", log_frames(api, container.id, None, timestamps=True)))]
    if attach:
        readers.append(threading.Thread(target=read, args=(
            "attach", attach_frames(api, container.id))))
    dockerd = int(Path("/var/run/docker.pid").read_text())
    wall, docker_cpu, own_cpu = time.monotonic(), _cpu_s(dockerd), time.process_time()
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    figures = {"seconds": time.monotonic() - wall,
               "dockerd_us_per_line": (_cpu_s(dockerd) - docker_cpu) / lines * 1e6,
               "readers_us_per_line": (time.process_time() - own_cpu) / lines * 1e6,
               "lines_logs": counts["logs"], "lines_attach": counts["attach"]}
    container.remove(force=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="appliance-base:bookworm")
    parser.add_argument("--lines", type=int, default=150_000)
    parser.add_argument("--rate", type=float, default=10_000.0)
    args = parser.parse_args()
    print("command: python " + " ".join(sys.argv))
    print("uptime:", os.popen("uptime").read().strip())
    client = DockerClient.from_env()
    alone = run(client, args.image, args.lines, args.rate, attach=False)
    both = run(client, args.image, args.lines, args.rate, attach=True)
    for name, figures in (("log stream alone (after ready)", alone),
                          ("log stream and the bar's attach (before ready)", both)):
        print(f"{name}: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in figures.items()))
    for key in ("dockerd_us_per_line", "readers_us_per_line"):
        print(f"{key}: with the attach {both[key]:.1f}, without {alone[key]:.1f} "
              f"({both[key] / alone[key]:.2f}x)")
    print("uptime:", os.popen("uptime").read().strip())


if __name__ == "__main__":
    main()
