"""The build worker's code (queue builds, worker/tasks.py): builds.py waits for the models,
builds or finds the engine image, and hands the deployment over to the engine agent."""
