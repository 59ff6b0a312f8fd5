/* Parameter blocks of the sequence family (seq_stop, seq_advance, seq_build_block),
 * shared by the kernels (nvcc) and the Cython launcher. All index arrays int32, C-contiguous;
 * finished is uint8 holding a FINISH_* reason (specdec_lib/reference/sequence.py). */
#pragma once
#include <stdint.h>

typedef struct {
  const int32_t* emitted;        /* [B, W] */
  const int32_t* num_accepted;   /* [B] */
  const int32_t* out_tokens;     /* [B, C] history (stop sequences may start before the block) */
  const int32_t* out_lens;       /* [B] */
  const int32_t* stop_ids;       /* [B, S] or NULL, -1 = unused */
  const int32_t* stop_seqs;      /* [B, NS, M] or NULL, rows left-padded with -1 */
  const int32_t* max_new_tokens; /* [B] */
  int32_t* accept_len;           /* [B] out */
  uint8_t* finished;             /* [B] in/out */
  int32_t batch, width, capacity, num_stop_ids, num_stop_seqs, stop_seq_len;
} SeqStopParams;

typedef struct {
  const int32_t* emitted;        /* [B, W] */
  const int32_t* accept_len;     /* [B] */
  int32_t* seq_lens;             /* [B] in/out */
  int32_t* out_tokens;           /* [B, C] in/out */
  int32_t* out_lens;             /* [B] in/out */
  int32_t* last_token;           /* [B] in/out */
  uint8_t* finished;             /* [B] in/out */
  int32_t batch, width, capacity;
} SeqAdvanceParams;

typedef struct {
  const int32_t* last_token;     /* [B] */
  const int32_t* draft_tokens;   /* [B, K] */
  const int32_t* num_draft;      /* [B] */
  const int32_t* seq_lens;       /* [B] */
  int32_t* cu_q;                 /* [B+1] out */
  int32_t* block_tokens;         /* [>= T] out */
  int32_t* positions;            /* [>= T] out */
  int32_t* draft_ids;            /* [>= T-B] out or NULL */
  int32_t batch, max_draft;
} SeqBuildBlockParams;
