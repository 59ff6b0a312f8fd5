"""numpy reference backend: one function per op, same names and argument order as
``specdec_lib.ops``; float64 math. It is the executable spec and the test oracle."""
from .copy import append_kv, copy  # noqa: F401
