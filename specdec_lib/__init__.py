"""specdec_lib: AOT-compiled CUDA kernels for chain speculative decoding.

GPU ops: ``specdec_lib.ops`` (also re-exported here); numpy reference backend:
``specdec_lib.reference``; what runs where: ``specdec_lib.runtime.info()``; exceptions:
``specdec_lib.errors``; status codes the kernels write: ``specdec_lib.status``.
Importing works without a GPU or driver (and never imports torch or cupy); the first GPU
call raises ``CudaUnavailable``. Model and weight loading log to the ``specdec_lib`` logger.
"""
from __future__ import annotations

__version__ = "0.1.0"   # the one place: pyproject.toml reads it (dynamic = ["version"])

import logging

from . import dtypes, errors, reference, runtime, status  # noqa: F401
from .arrays import DeviceArray   # (the driver layer loads on its first call, not here)
from .errors import CudaError, CudaUnavailable, ExtensionMissing
from .ops import *  # noqa: F401,F403
from .status import ConvStatus, FinishReason, GdnStatus, SampleStatus

# load/build messages go to this logger (and its children, e.g. specdec_lib.registry);
# a library adds no handler of its own beyond this one, which keeps them silent by default
logging.getLogger("specdec_lib").addHandler(logging.NullHandler())

# the ops (specdec_lib.ops; tests/test_api.py checks that this list is all of them)
_OPS = [
    "append_kv", "copy", "rope_append_kv", "verify_attention", "verify_attention_workspace_size",
    "gdn_verify", "gdn_commit", "gdn_flush", "gdn_journal_width", "conv1d_verify",
    "conv1d_commit", "conv1d_flush", "spec_sample", "spec_sample_workspace_size", "seq_stop", "seq_advance",
    "seq_build_block", "capture_hidden", "draft_carry", "draft_combine", "draft_map_tokens",
    "ngram_propose", "linear", "rms_norm", "rope", "rope_cos_sin_cache", "silu_mul",
    "gated_rms_norm", "advance_step",
]
__all__ = ["__version__", "DeviceArray", "CudaError", "CudaUnavailable", "ExtensionMissing",
           "SampleStatus", "FinishReason", "GdnStatus", "ConvStatus",
           "dtypes", "errors", "reference", "runtime", "status"] + _OPS
