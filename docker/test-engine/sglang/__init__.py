"""The test engine: a stdlib-only stand-in for SGLang, used only by the appliance's tests.

It is NOT SGLang. It installs itself as the `sglang` package inside the test engine
image so that `python3 -m sglang.launch_server ...` works with the real launch argv.
"""

__version__ = "0.5.23"
