"""Public GPU ops. Each validates its arguments (raising before any launch) and
launches on the caller's stream. The numpy twins live in ``specdec_lib.reference``."""
from .copy import append_kv, copy  # noqa: F401
from .attention import (rope_append_kv, verify_attention,  # noqa: F401
                        verify_attention_workspace_size)
from .gdn import gdn_commit, gdn_flush, gdn_journal_width, gdn_verify  # noqa: F401
from .conv import conv1d_commit, conv1d_flush, conv1d_verify  # noqa: F401
from .sampling import advance_step, spec_sample, spec_sample_workspace_size  # noqa: F401
from .sequence import seq_advance, seq_build_block, seq_stop  # noqa: F401
from .draft import (capture_hidden, draft_carry, draft_combine, draft_map_tokens,  # noqa: F401
                    ngram_propose)
from .layers import (gated_rms_norm, linear, rms_norm, rope, rope_cos_sin_cache,  # noqa: F401
                     silu_mul)
