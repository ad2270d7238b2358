"""A host's agent session (appliance.runtime.panel_link.agent_session_hold) across real
processes: the stored id is the restarted agent's, however the last one ended, and never a
second live process's."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

from appliance.runtime.panel_link import agent_session_hold

ROOT = str(Path(__file__).resolve().parents[3])
HOLDER = ("import sys, time\n"
          "from pathlib import Path\n"
          "from appliance.runtime.panel_link import agent_session_hold\n"
          "session, lock = agent_session_hold(Path(sys.argv[1]))\n"
          "print(session, lock is not None, flush=True)\n"
          "time.sleep(600)\n")


def _holder(credential: Path) -> tuple[subprocess.Popen[str], str, bool]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(credential)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    session, held = proc.stdout.readline().split()
    return proc, session, held == "True"


def test_a_killed_agents_session_is_its_successors_and_never_a_live_ones(tmp_path: Path) -> None:
    credential = tmp_path / "host-credential" / "credential"
    first, session, held = _holder(credential)
    assert held
    try:
        # While the first lives, another process of the host gets an id of its own.
        other, lock = agent_session_hold(credential)
        assert other != session and lock is None
    finally:
        first.send_signal(signal.SIGKILL)  # no clean end: the kernel drops its lock
        first.wait()
    taken, lock = agent_session_hold(credential)
    assert taken == session and lock is not None
    stored = credential.with_name("credential.session")
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    # Held here now: a further process is refused it ...
    second, second_session, held = _holder(credential)
    second.kill()
    second.wait()
    assert second_session != session and not held
    # ... and another state is another id.
    elsewhere, elsewhere_session, held = _holder(tmp_path / "elsewhere" / "credential")
    elsewhere.kill()
    elsewhere.wait()
    assert elsewhere_session != session and held
    os.close(lock)  # let go: taken again
    again, lock = agent_session_hold(credential)
    assert again == session and lock is not None
    os.close(lock)


def test_an_unreadable_state_gives_a_new_id_every_time(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    one, lock_one = agent_session_hold(blocked / "credential")
    two, lock_two = agent_session_hold(blocked / "credential")
    assert (lock_one, lock_two) == (None, None) and one != two
