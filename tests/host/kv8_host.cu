// Host-side check of cuda_src/common/kv8.cuh's software E4M3 paths (tests/test_kvquant_host.py):
// reads float32 values from argv[1], writes for each: kv8 encode (1 byte), CUDA's
// __nv_cvt_float_to_fp8 host fallback (1 byte); then the 256 decoded float32 values.
#include <cstdio>
#include <vector>
#include <cuda_fp8.h>
#include "common/kv8.cuh"

int main(int argc, char** argv) {
  FILE* f = std::fopen(argv[1], "rb");
  std::vector<float> x;
  float v;
  while (std::fread(&v, 4, 1, f) == 1) x.push_back(v);
  std::fclose(f);
  FILE* o = std::fopen(argv[2], "wb");
  for (float a : x) {
    unsigned char c[2] = {specdec::kv8::e4m3_encode_sw(a),
                          (unsigned char)__nv_cvt_float_to_fp8(a, __NV_SATFINITE, __NV_E4M3)};
    std::fwrite(c, 1, 2, o);
  }
  for (unsigned b = 0; b < 256; ++b) {
    float d = specdec::kv8::e4m3_decode_f32(b);
    std::fwrite(&d, 4, 1, o);
  }
  std::fclose(o);
  return 0;
}
