"""numpy reference backend: one function per op, same names and argument order as
``specdec_lib.ops``; float64 math. It is the executable spec and the test oracle."""
from .copy import append_kv, copy  # noqa: F401
from .sampling import spec_sample  # noqa: F401
from .attention import rope_append_kv, verify_attention  # noqa: F401
from .gdn import gdn_commit, gdn_decode_reference, gdn_flush, gdn_journal_width, gdn_verify  # noqa: F401
from .conv import conv1d_commit, conv1d_decode_reference, conv1d_flush, conv1d_verify  # noqa: F401
from .sequence import seq_advance, seq_build_block, seq_stop  # noqa: F401
from .draft import (capture_hidden, draft_carry, draft_combine, draft_map_tokens,  # noqa: F401
                    ngram_propose)
from .layers import (gated_rms_norm, linear, rms_norm, rope, rope_cos_sin_cache,  # noqa: F401
                     silu_mul)
