/* Parameter blocks of the draft family (draft_carry, capture_hidden, draft_combine,
 * draft_map_tokens, ngram_propose), shared by the kernels (nvcc) and the Cython launcher
 * (pyx/_draft.pyx). Semantics: specdec_lib/reference/draft.py. */
#pragma once
#include <stdint.h>

/* draft_carry_v<U>: out[b] = hidden row cu_q[b] + accept_len[b] - 1 - row_begin, placed at
 * out column col_begin, zero elsewhere. Moved as opaque units of U bytes (U = 1..16, the
 * largest that divides every pointer, stride and width below), so any element size works. */
typedef struct {
  const void* hidden;         /* [T_local, H_local] */
  const int32_t* cu_q;        /* [B+1] global block row offsets */
  const int32_t* accept_len;  /* [B] */
  void* out;                  /* [B, H_out] */
  int64_t hidden_stride;      /* bytes between rows of hidden */
  int64_t out_stride;         /* bytes between rows of out */
  int64_t row_begin;          /* global row index of hidden's row 0 */
  int64_t num_rows;           /* T_local */
  int64_t col_begin;          /* units: where hidden's columns start in out */
  int64_t hidden_units;       /* H_local * itemsize / U */
  int64_t out_units;          /* H_out * itemsize / U */
  int32_t batch;              /* B */
  int32_t pad_;
} DraftCarryParams;

/* capture_hidden_<dtype>: out[r, 0..H) = hidden[r] (+ residual[r]); out already points at
 * the tap's first column. */
typedef struct {
  const void* hidden;         /* [T, H] */
  const void* residual;       /* [T, H] or NULL */
  void* out;                  /* [T, taps*H], offset to column tap*H */
  int64_t hidden_stride;      /* elements between rows */
  int64_t residual_stride;
  int64_t out_stride;
  int64_t rows;               /* T */
  int32_t width;              /* H */
  int32_t vectorize;          /* 1: every row start is 16-byte aligned and H*itemsize % 16 == 0 */
} CaptureHiddenParams;

/* draft_combine_<dtype>_w<weight dtype>: out[r] = RMSNorm(e_r) * w_e ++ RMSNorm(hidden[r]) * w_h
 * with e_r = embed[r], or embed[token_ids[r]] (a table lookup) when token_ids is given. */
typedef struct {
  const void* embed;          /* [rows, H], or the table [vocab, H] when token_ids != NULL */
  const void* hidden;         /* [rows, H] */
  const void* embed_weight;   /* [H] */
  const void* hidden_weight;  /* [H] */
  const void* token_ids;      /* [rows] int32 or int64, or NULL */
  void* out;                  /* [rows, 2H] */
  int64_t embed_stride;       /* elements between rows */
  int64_t hidden_stride;
  int64_t out_stride;
  int64_t rows;
  int64_t vocab;              /* rows of the table when token_ids != NULL */
  int32_t width;              /* H */
  int32_t ids_64;             /* token_ids are int64 */
  int32_t unit_offset;        /* 1: scale by (1 + w) (zero-centred norms), 0: by w */
  int32_t vectorize;          /* 1: 16-byte vector I/O is valid for every row and weight */
  float eps;
  int32_t pad_;
} DraftCombineParams;

/* draft_map_tokens: out[i] = draft_ids[i] (+) d2t[draft_ids[i]], -1 for ids outside 0..Vd-1 */
typedef struct {
  const void* draft_ids;      /* [N] int32 or int64 */
  const void* d2t;            /* [Vd] int32 or int64 */
  int32_t* out;               /* [N] */
  int64_t count;              /* N */
  int64_t vocab;              /* Vd */
  int32_t ids_64;
  int32_t d2t_64;
  int32_t offsets;            /* 1: target = id + d2t[id] (HF EAGLE3), 0: target = d2t[id] */
  int32_t pad_;
} DraftMapTokensParams;

/* ngram_propose: prompt-lookup drafting. The context of sequence b is
 * prompt[b, :prompt_lens[b]] ++ output[b, :output_lens[b]] (lengths clamped into 0..P /
 * 0..O); draft_tokens[b, :m] = the m <= K tokens after the latest earlier occurrence of the
 * context's last n tokens (longest n in min_n..max_n first), -1 after; num_draft[b] = m. */
typedef struct {
  const int32_t* prompt;       /* [B, P], rows prompt_stride elements apart */
  const int32_t* prompt_lens;  /* [B] */
  const int32_t* output;       /* [B, O], rows output_stride elements apart */
  const int32_t* output_lens;  /* [B] */
  int32_t* draft_tokens;       /* [B, K] OUT, rows draft_stride elements apart */
  int32_t* num_draft;          /* [B] OUT */
  int64_t prompt_stride;       /* elements */
  int64_t output_stride;
  int64_t draft_stride;
  int32_t batch;               /* B */
  int32_t prompt_cap;          /* P (P + O < 2^31) */
  int32_t output_cap;          /* O */
  int32_t num_slots;           /* K, 1..64 */
  int32_t min_n;               /* 1 <= min_n <= max_n <= 32 */
  int32_t max_n;
  int32_t vec_prompt;          /* 1: every prompt row starts 16-byte aligned (int4 loads) */
  int32_t vec_output;          /* 1: the same for output rows */
} NgramProposeParams;
