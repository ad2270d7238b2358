"""Engine output: a log line becomes a phase, progress, stats or error event (lines, parser),
and a failure becomes a diagnosis with a fix (causes, matchers, diagnosis)."""
