"""Running engines: containers on the Docker engine, the watch that follows one to ready,
and the HTTP client that talks to a running engine."""
