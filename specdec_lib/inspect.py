"""Old name of ``specdec_lib.cubins`` (kept so existing imports work): importing it gives that
module itself, so ``specdec_lib.inspect.inspect_cubin is specdec_lib.cubins.inspect_cubin``."""
import sys

from . import cubins as _cubins

sys.modules[__name__] = _cubins
