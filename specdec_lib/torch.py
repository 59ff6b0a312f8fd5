"""Old import path of ``specdec_lib.torch_ops`` (kept so ``import specdec_lib.torch`` still
registers ``torch.ops.specdec.*``); new code imports ``specdec_lib.torch_ops``."""
from .torch_ops import *  # noqa: F401,F403
from .torch_ops import MISSING, NAMESPACE, OPS, ops, schema_of  # noqa: F401
