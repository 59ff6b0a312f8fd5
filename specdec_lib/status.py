"""Status codes the kernels write for data the host cannot see (never exceptions).

* ``SampleStatus``: ``spec_sample``'s ``status[b]`` (one code per sequence; the precedence and
  what each invalidates are in ``specdec_lib.reference.sampling``'s module docstring);
* ``FinishReason``: the ``finished[b]`` uint8 of the sequence ops (``seq_stop``,
  ``seq_advance``), 0 while the request runs;
* ``GdnStatus`` / ``ConvStatus``: bit flags in the optional ``status[b]`` of ``gdn_verify`` /
  ``gdn_commit`` / ``gdn_flush`` and ``conv1d_verify`` / ``conv1d_commit`` / ``conv1d_flush``
  (0 = fine; a flagged sequence was skipped, its state untouched).

They are ``IntEnum`` / ``IntFlag``: compare them with the ints a kernel wrote
(``status[b] == SampleStatus.NONFINITE``, ``GdnStatus(int(st[b]))`` names the bits). The
values are those of the CUDA headers (``cuda_src/*/*_params.h``) and of the reference modules'
``STATUS_*`` / ``FINISH_*`` constants, which stay where they are (tests/test_status.py checks
that all three agree).
"""
from __future__ import annotations

from enum import IntEnum, IntFlag

__all__ = ["SampleStatus", "FinishReason", "GdnStatus", "ConvStatus"]


class SampleStatus(IntEnum):
    """``spec_sample`` status of a sequence's block."""
    OK = 0
    NONFINITE = 1        #: NaN or +inf logit in a block row
    BAD_DRAFT = 2        #: a draft id out of range / not in the draft vocabulary (rejected)
    EMPTY = 3            #: a row with nothing to sample
    BAD_LAYOUT = 4       #: q_b < 1, q_b > emitted width, or the block outside the logits
    FILTER_SKIPPED = 5   #: ``filters=False`` was promised but this request filters


class FinishReason(IntEnum):
    """Why a sequence stopped (``finished[b]``); ``RUNNING`` (0) while it runs."""
    RUNNING = 0
    STOP_ID = 1          #: an emitted token is one of the request's stop ids
    STOP_SEQ = 2         #: the output now ends with one of the request's stop sequences
    MAX_LEN = 3          #: the output reached max_new_tokens
    CAPACITY = 4         #: the output buffer was too small (seq_advance truncated the append)
    BAD_ROW = 5          #: spec_sample gave an invalid row


class GdnStatus(IntFlag):
    """Bits of the gdn ops' ``status[b]``."""
    OK = 0
    BAD_SLOT = 1         #: slot id >= slots: outputs zero, state untouched
    BAD_ROWS = 2         #: cu_q[b..b+1] not inside [0, T]: sequence skipped
    BAD_ACCEPT = 4       #: accept_len[b] outside [0, q]: state untouched
    BAD_PENDING = 8      #: fused verify: pending rows outside the pending journal (no commit)


class ConvStatus(IntFlag):
    """Bits of the conv1d ops' ``status[b]``."""
    OK = 0
    BAD_SLOT = 1         #: slot id >= slots: outputs zero, state untouched
    BAD_ROWS = 2         #: cu_q[b..b+1] not inside [0, T]
    BAD_ACCEPT = 4       #: accept_len[b] outside [0, q]
    BAD_PENDING = 8      #: fused verify / flush: pending rows outside the pending rows (no commit)
