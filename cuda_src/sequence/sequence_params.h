/* Parameter blocks of the sequence family (seq_stop, seq_advance, seq_build_block),
 * shared by the kernels (nvcc) and the Cython launcher (pyx/_sequence.pyx). Every array
 * is int32 and C-contiguous (specdec_lib/ops/sequence.py checks); finished is uint8
 * holding a FINISH_* reason code (specdec_lib/reference/sequence.py). */
#pragma once
#include <stdint.h>

/* reason codes written into finished[b]; keep in step with reference/sequence.py */
#define SPECDEC_FINISH_STOP_ID 1
#define SPECDEC_FINISH_STOP_SEQ 2
#define SPECDEC_FINISH_MAX_LEN 3
#define SPECDEC_FINISH_CAPACITY 4
#define SPECDEC_FINISH_BAD_ROW 5

typedef struct {
  const int32_t* emitted;        /* [B, W] d1..dn then the correction/bonus token */
  const int32_t* num_accepted;   /* [B] n */
  const int32_t* out_tokens;     /* [B, C] history: stop sequences may start before the block */
  const int32_t* out_lens;       /* [B] */
  const int32_t* stop_ids;       /* [B, S] or NULL; -1 = unused slot */
  const int32_t* stop_seqs;      /* [B, NS, M] or NULL; rows left-padded with -1 */
  const int32_t* max_new_tokens; /* [B] */
  int32_t* accept_len;           /* [B] out: rows to commit, 0..n+1 */
  uint8_t* finished;             /* [B] in/out */
  int32_t batch;                 /* B */
  int32_t width;                 /* W */
  int32_t capacity;              /* C */
  int32_t num_stop_ids;          /* S (0 when stop_ids is NULL) */
  int32_t num_stop_seqs;         /* NS (0 when stop_seqs is NULL) */
  int32_t stop_seq_len;          /* M */
} SeqStopParams;

typedef struct {
  const int32_t* emitted;        /* [B, W] */
  const int32_t* accept_len;     /* [B] */
  int32_t* seq_lens;             /* [B] in/out: L += accept_len */
  int32_t* out_tokens;           /* [B, C] in/out */
  int32_t* out_lens;             /* [B] in/out */
  int32_t* last_token;           /* [B] in/out */
  uint8_t* finished;             /* [B] in/out */
  int32_t batch;                 /* B */
  int32_t width;                 /* W */
  int32_t capacity;              /* C */
  int32_t pad_;
} SeqAdvanceParams;

typedef struct {
  const int32_t* last_token;     /* [B] t0 */
  const int32_t* draft_tokens;   /* [B, K] */
  const int32_t* num_draft;      /* [B] k_b, clamped to 0..K */
  const int32_t* seq_lens;       /* [B] L */
  int32_t* cu_q;                 /* [B+1] out */
  int32_t* block_tokens;         /* [>= B*(K+1)] out */
  int32_t* positions;            /* [>= B*(K+1)] out */
  int32_t* draft_ids;            /* [>= B*K] out, or NULL */
  int32_t batch;                 /* B */
  int32_t max_draft;             /* K */
} SeqBuildBlockParams;
