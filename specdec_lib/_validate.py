"""Argument checks shared by every op (compiled: see pyx/_args.pyx).

They run before any launch and raise TypeError/ValueError naming the argument.
"""
from ._args import DeviceArg, as_stream, check_int, check_shape  # noqa: F401
