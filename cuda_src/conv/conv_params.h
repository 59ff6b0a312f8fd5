/* Parameter blocks of the conv family (conv1d_verify, conv1d_commit), shared by the
 * kernels (nvcc) and the Cython launcher. Strides in elements, 64-bit.
 *
 * conv state pool [slots, dim, W-1]: per channel the last W-1 inputs, oldest first,
 * contiguous; dim and slot strides free. dtype codes as in gdn/gdn_params.h. */
#pragma once
#include <stdint.h>

#define SPECDEC_CONV_MAX_WIDTH 8

/* status[b] bits (0 = fine), written by the CTA of channel block 0 of sequence b */
#define SPECDEC_CONV_BAD_SLOT 1     /* slot id >= slots: outputs zero, state untouched */
#define SPECDEC_CONV_BAD_ROWS 2     /* cu_q[b..b+1] not inside [0, T] */
#define SPECDEC_CONV_BAD_ACCEPT 4   /* accept_len[b] outside [0, q] */
#define SPECDEC_CONV_BAD_PENDING 8  /* fused mode / flush: pending rows outside the pending
                                       rows: nothing committed for the sequence */

typedef struct {
  const void* x;              /* [T, dim], dim contiguous */
  const void* weight;         /* [dim, W], W contiguous */
  const void* bias;           /* [dim] or NULL */
  void* conv_state;           /* read only, but in fused mode */
  const int32_t* slot_ids;    /* [B]; < 0 = padding row */
  const int32_t* cu_q;        /* [B+1] */
  void* out;                  /* [T, dim] */
  void* journal;              /* [T, dim] or NULL: x copied (what conv1d_commit reads) */
  int32_t* status;            /* [B] or NULL */
  /* fused mode (pending != NULL): state = (state ++ pending rows row0[b] .. + len[b] - 1)
     [-(W-1):], written back, before the block is verified over it (the previous round's
     commit folded into this round's verify) */
  const void* pending;        /* [Tp, dim] or NULL */
  const int32_t* pending_row0;  /* [B] */
  const int32_t* pending_len;   /* [B] */
  int64_t pending_stride_t;
  int64_t x_stride_t;
  int64_t out_stride_t;
  int64_t journal_stride_t;
  int64_t weight_stride_c;
  int64_t state_stride_slot;
  int64_t state_stride_c;
  int32_t num_rows;
  int32_t batch;
  int32_t dim;
  int32_t width;              /* W, 2..8 */
  int32_t num_slots;
  int32_t silu;               /* 1: out = silu(conv + bias) */
  int32_t x_dtype, weight_dtype, bias_dtype, state_dtype, out_dtype, journal_dtype;
  int32_t pending_rows;
  int32_t pending_dtype;
} ConvVerifyParams;

typedef struct {
  void* conv_state;           /* advanced in place */
  const int32_t* slot_ids;
  const int32_t* cu_q;        /* [B+1], or NULL with row0 (conv1d_flush) */
  const int32_t* row0;        /* [B] or NULL: sequence b's rows start at row0[b] (flush) */
  const int32_t* accept_len;  /* [B]: rows shifted in (flush: pending_len) */
  const void* journal;        /* [T, dim]: x itself or conv1d_verify's copy */
  int32_t* status;
  int64_t journal_stride_t;
  int64_t state_stride_slot;
  int64_t state_stride_c;
  int32_t num_rows;
  int32_t batch;
  int32_t dim;
  int32_t width;
  int32_t num_slots;
  int32_t journal_dtype;
  int32_t state_dtype;
  int32_t pad_;
} ConvCommitParams;
