"""Where the browser tests put their screenshots: artifacts/ (ignored by git), so a run
leaves the work tree as it found it. APPLIANCE_REFRESH_DOCS_IMAGES=1 writes them into docs/
instead, to refresh the README's pictures on purpose (then commit them)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "artifacts"


def screenshot_path(name: str) -> str:
    folder = DOCS if os.environ.get("APPLIANCE_REFRESH_DOCS_IMAGES") == "1" else ARTIFACTS
    folder.mkdir(exist_ok=True)
    return str(folder / name)
