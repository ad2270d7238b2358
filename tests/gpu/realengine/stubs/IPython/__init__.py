# STUB (real-engine rig): sglang/utils.py imports IPython.display for notebook helpers only.
