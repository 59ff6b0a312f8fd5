"""Public GPU ops. Each validates its arguments (raising before any launch) and
launches on the caller's stream. The numpy twins live in ``specdec_lib.reference``."""
from .copy import append_kv, copy  # noqa: F401
