// Blockwise symmetric quantization (ZeRO++'s qwZ and qgZ, zero/zeropp.h), the cpu kernels.
//
// Note [Blockwise quantization]: n values are cut into blocks of `block` elements (the last may be
// shorter); each block b has the scale s_b = max |x| / q_max (q_max = 127 for int8, 7 for int4)
// and each value the code round_half_even(x / s_b) in [-q_max, q_max] (0 where s_b is 0). The
// packed form is the f32 scales of all blocks, then the codes: int8 one byte each, int4 two per
// byte (element 2i in the low nibble, 2i+1 in the high, each as code + 8). Decoding gives
// code * s_b, so the error per value is at most s_b / 2 and a block of zeros stays exact. A
// non-finite value makes its block's scale non-finite and every value of the block decodes as
// NaN: an fp16 overflow stays visible to the overflow check after a quantized reduction.
// Thread-safety: pure functions of their arguments (OpenMP inside).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zerone/core/dtype.h"

namespace zerone::kernels::cpu {

// Bytes of the packed form of n values.
size_t quantized_bytes(size_t n, int bits, size_t block);
// out (quantized_bytes) = the packed form of src (n values of src_dtype: f32, bf16 or f16).
void quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out);
// dst (n values of dst_dtype) = decoded in; with `accumulate` (dst f32 only) dst += decoded.
void dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype, bool accumulate);

}  // namespace zerone::kernels::cpu
