"""How to call a deployment through the gateway: the examples the detail page shows.

Pure text building (no reads): the gateway's selectors say where and as what; this module
writes it down as a person would paste it. The key is always `$SD_API_KEY`, never a secret.
"""

from __future__ import annotations

import json
import shlex

KEY_VAR = "SD_API_KEY"  # the environment variable every example reads the key from
EXAMPLE_MESSAGE = "Say hello in one sentence."


def curl_example(*, base_url: str, model: str) -> str:
    """A streamed chat completion with curl; quoted so any model name pastes safely."""
    body = json.dumps({"model": model, "stream": True,
                       "messages": [{"role": "user", "content": EXAMPLE_MESSAGE}]})
    return "\n".join([
        f"curl -N {shlex.quote(base_url + '/chat/completions')} \\",
        f'  -H "Authorization: Bearer ${KEY_VAR}" \\',
        '  -H "Content-Type: application/json" \\',
        f"  -d {shlex.quote(body)}",
    ])


def python_example(*, base_url: str, model: str) -> str:
    """The same call with the `openai` package, streaming (a JSON string is a Python literal)."""
    return "\n".join([
        "import os",
        "",
        "from openai import OpenAI",
        "",
        f'client = OpenAI(base_url={json.dumps(base_url)}, api_key=os.environ["{KEY_VAR}"])',
        "stream = client.chat.completions.create(",
        f"    model={json.dumps(model)},",
        f'    messages=[{{"role": "user", "content": {json.dumps(EXAMPLE_MESSAGE)}}}],',
        "    stream=True,",
        ")",
        "for chunk in stream:",
        "    if chunk.choices and chunk.choices[0].delta.content:",
        '        print(chunk.choices[0].delta.content, end="", flush=True)',
        "print()",
    ])
