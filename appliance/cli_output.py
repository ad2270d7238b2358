"""What every `appliance` command prints for its result and for bad input, and its exit
codes: JSON on stdout by default, human text with --text."""

from __future__ import annotations

import json
from typing import Any

from appliance.engine.spec import FieldError

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


def emit(data: Any) -> None:
    print(json.dumps(data, indent=2))


def bad_input(errors: list[FieldError], text: bool) -> int:
    if text:
        for e in errors:
            print(f"error  {e.field or '<spec>'}: {e.message}\n       fix: {e.fix}")
    else:
        emit({"errors": [e.to_dict() for e in errors]})
    return EXIT_BAD_INPUT
