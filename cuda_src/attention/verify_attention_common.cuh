// What the 16-bit and the 8-bit-cache verify_attention kernels share (each includes it into
// its own translation unit, inside its anonymous namespace): the CTA shape, the pipeline depth
// per code family, the exp2 / load helpers and a sequence's view of the batch.
#pragma once

constexpr int kThreads = VERIFY_ATTN_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kEpiCols = 64;     // output columns combined per epilogue pass
constexpr int kEpiStride = 72;   // floats per row of the epilogue buffer (padding: no bank conflicts)
constexpr float kLn2 = 0.6931471805599453f;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
constexpr int kStages = 3;
constexpr bool kHasBf16Mma = true;
#else
constexpr int kStages = 1;
constexpr bool kHasBf16Mma = false;
#endif

static_assert(VERIFY_ATTN_EPILOGUE_SMEM == kWarps * 16 * kEpiStride * 4 + 2 * kWarps * 16 * 4,
              "epilogue smem constant out of sync with the kernel");

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t ld_u32(const uint16_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
  uint32_t n;
  asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(n));
  return n;
}

// Keys of sequence b handled by `split`; false when the split (or the sequence) has none.
struct SeqView {
  int q0, qn, L, kv_begin, kv_end, num_splits;
  bool bad_len;
};

__device__ __forceinline__ bool seq_view(const int32_t* cu_q, const int32_t* seq_lens, int b,
                                         int max_q, int num_tokens, int num_splits, int kv_chunk,
                                         SeqView& v) {
  v.q0 = __ldg(cu_q + b);
  const int q1 = __ldg(cu_q + b + 1);
  v.qn = q1 - v.q0;
  if (v.q0 < 0 || v.qn <= 0 || v.qn > max_q || q1 > num_tokens) return false;
  v.L = __ldg(seq_lens + b);
  v.bad_len = v.L < 0;
  if (v.bad_len) v.L = 0;
  const int n_ctx = v.L + v.qn;
  v.num_splits = min(num_splits, (n_ctx + kv_chunk - 1) / kv_chunk);
  return true;
}

// bf16 needs sm_80 tensor cores: the compute_75 build keeps the symbols but they trap
template <typename Mma>
constexpr bool kRunsHere = kHasBf16Mma || !Mma::kIsBf16;

// Where key `key` lives in the paged caches. kv_page: its page, or -1 when the key lies at
// or past kv_end (its smem row is zero-filled) or its page is outside the table / pool (then
// `bad` is set: the CTA writes NaN rows). kv_row: the element offsets of its K and V rows from
// the caches' bases (page * stride_page + slot * stride_slot; the head's offset is the
// caller's), {-1, -1} for page -1. One thread works this out per key row of a tile and parks
// it in shared memory, so the 8-16 threads copying that row's 16-byte chunks each add one
// offset instead of repeating the page-table read and the 64-bit page arithmetic (s35: that
// arithmetic was ~40% of the 8-bit kernel's instructions).
struct KVRow {
  int64_t k, v;
};

template <typename Flag>
__device__ __forceinline__ int kv_page(const VerifyAttentionParams& p, const int32_t* pt_row,
                                       int key, int kv_end, Flag& bad) {
  if (key >= kv_end) return -1;
  const int pidx = key >> p.page_size_log2;
  const int page = pidx < p.max_pages ? __ldg(pt_row + pidx) : -1;
  if (page < 0 || page >= p.num_pages) {
    bad = 1;
    return -1;
  }
  return page;
}

__device__ __forceinline__ KVRow kv_row(const VerifyAttentionParams& p, int page, int key) {
  if (page < 0) return KVRow{-1, -1};
  const int64_t slot = key & ((1 << p.page_size_log2) - 1);
  return KVRow{page * p.k_stride_page + slot * p.k_stride_slot,
               page * p.v_stride_page + slot * p.v_stride_slot};
}

// ldmatrix row addresses by XOR (s36). The tiles are XOR-swizzled on 16-byte chunks (chunk c
// of row r sits at chunk c ^ (r & 7)), and every row a lane hands to ldmatrix has r & 7 ==
// lane & 7, so chunk c = c_even + b (b = 0 / 1) of a row is at
// swz_chunk(swz_row(row_addr, b, lane), c_even, swz_xor(lane)): one LOP3 an address instead of
// the swizzle worked out again each 16-key step. Exact where row_addr's bits 4 up to the
// chunk field's top are clear: rows of 128 bytes or more, each at a multiple of its size
// (the caller aligns its rings and checks).
__device__ __forceinline__ uint32_t swz_row(uint32_t row_addr, int b, int lane) {
  return row_addr + (((b ^ lane) & 1) << 4);
}
__device__ __forceinline__ uint32_t swz_xor(int lane) {
  return static_cast<uint32_t>(lane & 6) << 4;
}
__device__ __forceinline__ uint32_t swz_chunk(uint32_t row, int c_even, uint32_t xsw) {
  return (row | (static_cast<uint32_t>(c_even) << 4)) ^ xsw;
}
