/* Parameter blocks of the gdn family (gdn_verify, gdn_commit), shared by the kernels
 * (nvcc) and the Cython launcher: one struct per kernel, passed by value.
 * Strides are in elements and 64-bit; the last dimension of every tensor is contiguous.
 *
 * State pool: [slots, Hv, Dk, Dv] (layout "kv") or [slots, Hv, Dv, Dk] ("vk"), the
 * inner [Hv, ., .] block contiguous, the slot stride free (a view into a bigger cache).
 * Journal: float32 [T, W], W = Hk*Dk + Hv*Dv + 2*Hv, per row k_hat | v | g | beta.
 * gdn_verify_fused_* kernels take GdnVerifyParams with the pending_* fields set and write the
 * state (state is then read and written). */
#pragma once
#include <stdint.h>

/* dtype codes of inputs/outputs whose dtype is chosen at run time */
#define SPECDEC_DT_F32 0
#define SPECDEC_DT_F16 1
#define SPECDEC_DT_BF16 2

/* status[b] bits (0 = fine); written by the CTA of (slice 0, head 0) of sequence b */
#define SPECDEC_GDN_BAD_SLOT 1      /* slot id >= slots: outputs zero, state untouched */
#define SPECDEC_GDN_BAD_ROWS 2      /* cu_q[b..b+1] not inside [0, T]: sequence skipped */
#define SPECDEC_GDN_BAD_ACCEPT 4    /* accept_len[b] outside [0, q]: state untouched */
#define SPECDEC_GDN_BAD_PENDING 8   /* fused verify: pending rows outside the pending journal:
                                       nothing committed, the block verified on the stored state */

typedef struct {
  const void* q;              /* [T, Hk, Dk] */
  const void* k;              /* [T, Hk, Dk] */
  const void* v;              /* [T, Hv, Dv] */
  const void* gate0;          /* g [T, Hv] or, fused, raw a [T, Hv] */
  const void* gate1;          /* beta [T, Hv] or, fused, raw b [T, Hv] */
  const void* A_log;          /* [Hv] (fused gating only, else NULL) */
  const void* dt_bias;        /* [Hv] (fused gating only, else NULL) */
  const void* state;          /* read only */
  const int32_t* slot_ids;    /* [B]; < 0 = padding row */
  const int32_t* cu_q;        /* [B+1]; gdn_verify_fused: NULL = no block (gdn_flush) */
  void* out;                  /* [T, Hv, Dv] */
  float* journal;             /* [T, W] */
  int32_t* status;            /* [B] or NULL */
  int64_t q_stride_t, q_stride_h;
  int64_t k_stride_t, k_stride_h;
  int64_t v_stride_t, v_stride_h;
  int64_t out_stride_t, out_stride_h;
  int64_t gate_stride_t[2];   /* gate0, gate1; head stride 1 */
  int64_t state_stride_slot;
  int64_t journal_stride_t;
  int32_t num_rows;           /* T */
  int32_t batch;              /* B */
  int32_t num_k_heads;        /* Hk */
  int32_t num_v_heads;        /* Hv */
  int32_t head_v_dim;         /* Dv (Dk is in the kernel name) */
  int32_t num_slots;
  int32_t num_slices;         /* Dv / columns per CTA */
  int32_t qk_l2norm;          /* 1: q, k <- x / sqrt(sum x^2 + 1e-6) */
  int32_t fused_gating;       /* 1: gate0/gate1 are a/b, with A_log and dt_bias */
  int32_t qkv_dtype;          /* SPECDEC_DT_* of q, k, v */
  int32_t out_dtype;
  int32_t gate_dtype[4];      /* gate0, gate1, A_log, dt_bias */
  float scale;                /* applied to q after the norm */
  /* gdn_verify_fused_* only (NULL / 0 otherwise): before the block, the state is advanced over
   * the previous round's accepted rows pending_row0[b] .. + pending_len[b] - 1 of
   * pending_journal and written back (the commit of round r folded into the verify of r+1) */
  const float* pending_journal;     /* [Tp, W], the previous verify's journal (not `journal`) */
  const int32_t* pending_row0;      /* [B] */
  const int32_t* pending_len;       /* [B]; 0: nothing pending */
  int64_t pending_journal_stride_t;
  int32_t pending_num_rows;         /* Tp */
  int32_t prefetch_ahead;           /* > 0: CTA x asks L2 for CTA x + this's state slice */
} GdnVerifyParams;

typedef struct {
  void* state;                /* advanced in place */
  const int32_t* slot_ids;    /* [B] */
  const int32_t* cu_q;        /* [B+1] */
  const int32_t* accept_len;  /* [B] */
  const float* journal;       /* [T, W] written by gdn_verify */
  int32_t* status;            /* [B] or NULL */
  int64_t state_stride_slot;
  int64_t journal_stride_t;
  int32_t num_rows;
  int32_t batch;
  int32_t num_k_heads;
  int32_t num_v_heads;
  int32_t head_v_dim;
  int32_t num_slots;
  int32_t num_slices;
  int32_t prefetch_ahead;     /* as in GdnVerifyParams */
} GdnCommitParams;
