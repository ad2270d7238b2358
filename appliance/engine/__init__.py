"""What the appliance knows about SGLang: the deployment spec and its flags, recipes, launch
arguments, and the engine's /metrics format."""
