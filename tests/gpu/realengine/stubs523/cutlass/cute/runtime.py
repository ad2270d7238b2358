# STUB (real-engine rig): see cutlass/_absent.py.
from cutlass._absent import module_getattr

__getattr__ = module_getattr("cutlass.cute.runtime")
