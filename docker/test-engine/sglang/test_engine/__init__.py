"""The test engine's modules behind `python3 -m sglang.launch_server`: NOT SGLang.

Used only by the appliance's test suite; launch_server.py keeps the entry point.
By theme:

- settings: constants and the TEST_ENGINE_* knobs (docker/test-engine/README.md)
- config: the launch flags and the Config derived from them (SGLang's ServerArgs)
- output: the logging line prefix, the streams, tqdm-style progress bars
- loglines: SGLang's log line formats ("new" 0.5.23 and "old" pre-0.5.12)
- engine: the engine's state (the launch Config as engine.CFG), counters, histograms
- tracebacks: the tracebacks the failure modes print
- phases: the startup sequence (load, KV cache, capture, ready) and its failure modes
- generation: decode steps and the ddtree-width crash on the first request
- server: the HTTP endpoints (httpserver: the server, quiet about clients gone as uvicorn
  is); metrics: the Prometheus /metrics text
"""
