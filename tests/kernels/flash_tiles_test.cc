// The CUDA backend's flash attention, emulated on the host (Note [Flash attention on CUDA cores],
// zerone/kernels/cuda/attention.cu): the three kernels' loops ported lane by lane with the tiling
// of zerone/kernels/cuda/flash_tiles.h (the header the kernels use), warps' butterfly shuffles
// written out, shared-memory tiles as arrays with their zero-filled tails, in f32. Checked against
// the double reference (tests/reference_ops.h) at shapes that cut every kind of tile short: T = 1,
// T one past a lane tile, several warp tiles with a partial last one, GQA groups of 1, 2 and 3,
// head sizes of every chunk count (1, 2, 4, 8 chunks of 32 channels) including odd ones. This runs
// without a GPU and proves the algorithm (masks at tile edges, logsumexp, the group sums); the CUDA
// code itself is checked by the op harness's cuda rows (backend_ops_test.cc) on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "tests/reference_ops.h"
#include "zerone/core/rng.h"
#include "zerone/kernels/cuda/flash_tiles.h"

namespace zerone::cuda::flash {
namespace {

using ref::Vec;
using Lanes = std::array<float, kLanes>;

// __shfl_xor_sync's butterfly over a warp: after it every lane holds the reduction.
Lanes butterfly(Lanes v, bool take_max) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    Lanes next;
    for (int l = 0; l < kLanes; ++l) next[l] = take_max ? std::fmax(v[l], v[l ^ offset]) : v[l] + v[l ^ offset];
    v = next;
  }
  for (int l = 1; l < kLanes; ++l) EXPECT_EQ(v[l], v[0]) << "a butterfly leaves every lane the same value";
  return v;
}

float dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += a[d] * b[d];
  return s;
}

struct Shape {
  int B, T, NH, NKV, hs;
  int G() const { return NH / NKV; }
  size_t R() const { return static_cast<size_t>(NH + 2 * NKV) * hs; }
  size_t q(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * R() + static_cast<size_t>(h) * hs; }
  size_t k(int b, int t, int kv) const { return (static_cast<size_t>(b) * T + t) * R() + static_cast<size_t>(NH + kv) * hs; }
  size_t v(int b, int t, int kv) const { return (static_cast<size_t>(b) * T + t) * R() + static_cast<size_t>(NH + NKV + kv) * hs; }
  size_t o(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * NH * hs + static_cast<size_t>(h) * hs; }
  size_t stat(int b, int h, int t) const { return (static_cast<size_t>(b) * NH + h) * T + t; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hs)); }
};

// attention.cu's load_tile: `rows` rows from `first` of a head view, zero at or past T.
template <typename At>
std::vector<float> load_tile(const std::vector<float>& src, At at, int first, int rows, int T, int hs) {
  std::vector<float> tile(static_cast<size_t>(rows) * smem_stride(hs), 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < hs; ++d)
      if (first + r < T) tile[static_cast<size_t>(r) * smem_stride(hs) + d] = src[at(first + r) + d];
  return tile;
}

// flash_forward_kernel, every block in turn.
void emulate_forward(std::vector<float>& out, std::vector<float>& lse, const std::vector<float>& qkv, const Shape& s) {
  const int chunks = chunks_for(s.hs), rows = rows_per_warp(chunks), br = warp_tile_rows(chunks);
  const int hs = s.hs, T = s.T, ld = smem_stride(hs);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int tile = 0; tile < tiles_of(T, br); ++tile) {
        const int kv = h / s.G(), q0 = tile * br;
        const auto q_s = load_tile(qkv, [&](int t) { return s.q(b, t, h); }, q0, br, T, hs);
        std::vector<float> m(br, -INFINITY), l(br, 0.0f), o(static_cast<size_t>(br) * kLanes * chunks, 0.0f);
        auto acc = [&](int r, int lane, int c) -> float& { return o[(static_cast<size_t>(r) * kLanes + lane) * chunks + c]; };
        for (int jt = 0; jt < key_tiles_seen(q0, br, T); ++jt) {
          const int k0 = jt * kLanes;
          const auto k_s = load_tile(qkv, [&](int t) { return s.k(b, t, kv); }, k0, kLanes, T, hs);
          const auto v_s = load_tile(qkv, [&](int t) { return s.v(b, t, kv); }, k0, kLanes, T, hs);
          for (int warp = 0; warp < kWarps; ++warp)
            for (int rr = 0; rr < rows; ++rr) {
              const int r = warp * rows + rr, query = q0 + r;
              if (query >= T) continue;
              Lanes score, p;
              for (int lane = 0; lane < kLanes; ++lane)
                score[lane] = sees(query, k0 + lane, T) ? s.scale() * dot(&q_s[r * ld], &k_s[lane * ld], hs) : -INFINITY;
              float rescale;
              const float m_new = online_max(m[r], butterfly(score, true)[0], &rescale);
              for (int lane = 0; lane < kLanes; ++lane) p[lane] = sees(query, k0 + lane, T) ? expf(score[lane] - m_new) : 0.0f;
              l[r] = l[r] * rescale + butterfly(p, false)[0];
              m[r] = m_new;
              for (int lane = 0; lane < kLanes; ++lane)
                for (int c = 0; c < chunks; ++c) acc(r, lane, c) *= rescale;
              for (int j = 0; j < kLanes; ++j)
                for (int lane = 0; lane < kLanes; ++lane)
                  for (int c = 0; c < chunks; ++c)
                    if (lane + kLanes * c < hs) acc(r, lane, c) += p[j] * v_s[j * ld + lane + kLanes * c];
            }
        }
        for (int r = 0; r < br; ++r) {
          const int query = q0 + r;
          if (query >= T) continue;
          for (int lane = 0; lane < kLanes; ++lane)
            for (int c = 0; c < chunks; ++c)
              if (lane + kLanes * c < hs) out[s.o(b, query, h) + lane + kLanes * c] = acc(r, lane, c) * (1.0f / l[r]);
          lse[s.stat(b, h, query)] = m[r] + logf(l[r]);
        }
      }
}

// flash_dq_kernel: dQ into dqkv and D into dsum.
void emulate_dq(std::vector<float>& dqkv, std::vector<float>& dsum, const std::vector<float>& dout,
                const std::vector<float>& qkv, const std::vector<float>& lse, const Shape& s) {
  const int chunks = chunks_for(s.hs), rows = rows_per_warp(chunks), br = warp_tile_rows(chunks);
  const int hs = s.hs, T = s.T, ld = smem_stride(hs);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int tile = 0; tile < tiles_of(T, br); ++tile) {
        const int kv = h / s.G(), q0 = tile * br;
        const auto q_s = load_tile(qkv, [&](int t) { return s.q(b, t, h); }, q0, br, T, hs);
        const auto do_s = load_tile(dout, [&](int t) { return s.o(b, t, h); }, q0, br, T, hs);
        std::vector<Lanes> D(br);  // each lane's share until the end of sweep 0
        for (Lanes& x : D) x.fill(0.0f);
        std::vector<float> dq(static_cast<size_t>(br) * kLanes * chunks, 0.0f);
        auto acc = [&](int r, int lane, int c) -> float& { return dq[(static_cast<size_t>(r) * kLanes + lane) * chunks + c]; };
        for (int sweep = 0; sweep < 2; ++sweep) {
          for (int jt = 0; jt < key_tiles_seen(q0, br, T); ++jt) {
            const int k0 = jt * kLanes;
            const auto k_s = load_tile(qkv, [&](int t) { return s.k(b, t, kv); }, k0, kLanes, T, hs);
            const auto v_s = load_tile(qkv, [&](int t) { return s.v(b, t, kv); }, k0, kLanes, T, hs);
            for (int warp = 0; warp < kWarps; ++warp)
              for (int rr = 0; rr < rows; ++rr) {
                const int r = warp * rows + rr, query = q0 + r;
                if (query >= T) continue;
                const float row_lse = lse[s.stat(b, h, query)];
                Lanes p, dp, ds;
                for (int lane = 0; lane < kLanes; ++lane) {
                  p[lane] = dp[lane] = 0.0f;
                  if (sees(query, k0 + lane, T)) {
                    p[lane] = expf(s.scale() * dot(&q_s[r * ld], &k_s[lane * ld], hs) - row_lse);
                    dp[lane] = dot(&do_s[r * ld], &v_s[lane * ld], hs);
                  }
                }
                if (sweep == 0) {
                  for (int lane = 0; lane < kLanes; ++lane) D[r][lane] += p[lane] * dp[lane];
                  continue;
                }
                for (int lane = 0; lane < kLanes; ++lane) ds[lane] = p[lane] * (dp[lane] - D[r][lane]);
                for (int j = 0; j < kLanes; ++j)
                  for (int lane = 0; lane < kLanes; ++lane)
                    for (int c = 0; c < chunks; ++c)
                      if (lane + kLanes * c < hs) acc(r, lane, c) += ds[j] * k_s[j * ld + lane + kLanes * c];
              }
          }
          if (sweep == 0)
            for (Lanes& x : D) x = butterfly(x, false);
        }
        for (int r = 0; r < br; ++r) {
          const int query = q0 + r;
          if (query >= T) continue;
          for (int lane = 0; lane < kLanes; ++lane)
            for (int c = 0; c < chunks; ++c)
              if (lane + kLanes * c < hs) dqkv[s.q(b, query, h) + lane + kLanes * c] = s.scale() * acc(r, lane, c);
          dsum[s.stat(b, h, query)] = D[r][0];
        }
      }
}

// flash_dkv_kernel: dK and dV into dqkv, the group's heads in order.
void emulate_dkv(std::vector<float>& dqkv, const std::vector<float>& dout, const std::vector<float>& qkv,
                 const std::vector<float>& lse, const std::vector<float>& dsum, const Shape& s) {
  const int chunks = chunks_for(s.hs), rows = rows_per_warp(chunks), bc = warp_tile_rows(chunks);
  const int hs = s.hs, T = s.T, ld = smem_stride(hs);
  for (int b = 0; b < s.B; ++b)
    for (int kv = 0; kv < s.NKV; ++kv)
      for (int tile = 0; tile < tiles_of(T, bc); ++tile) {
        const int k0 = tile * bc;
        const auto k_s = load_tile(qkv, [&](int t) { return s.k(b, t, kv); }, k0, bc, T, hs);
        const auto v_s = load_tile(qkv, [&](int t) { return s.v(b, t, kv); }, k0, bc, T, hs);
        std::vector<float> dk(static_cast<size_t>(bc) * kLanes * chunks, 0.0f), dv(dk.size(), 0.0f);
        auto at = [&](int r, int lane, int c) { return (static_cast<size_t>(r) * kLanes + lane) * chunks + c; };
        for (int g = 0; g < s.G(); ++g) {
          const int h = kv * s.G() + g;
          for (int it = first_query_tile_seeing(k0); it < tiles_of(T, kLanes); ++it) {
            const int q0 = it * kLanes;
            const auto q_s = load_tile(qkv, [&](int t) { return s.q(b, t, h); }, q0, kLanes, T, hs);
            const auto do_s = load_tile(dout, [&](int t) { return s.o(b, t, h); }, q0, kLanes, T, hs);
            Lanes lse_s, d_s;
            for (int lane = 0; lane < kLanes; ++lane) {
              lse_s[lane] = q0 + lane < T ? lse[s.stat(b, h, q0 + lane)] : 0.0f;
              d_s[lane] = q0 + lane < T ? dsum[s.stat(b, h, q0 + lane)] : 0.0f;
            }
            for (int warp = 0; warp < kWarps; ++warp)
              for (int rr = 0; rr < rows; ++rr) {
                const int r = warp * rows + rr, key = k0 + r;
                if (key >= T) continue;
                Lanes p, ds;
                for (int lane = 0; lane < kLanes; ++lane) {
                  p[lane] = ds[lane] = 0.0f;
                  if (sees(q0 + lane, key, T)) {
                    p[lane] = expf(s.scale() * dot(&q_s[lane * ld], &k_s[r * ld], hs) - lse_s[lane]);
                    ds[lane] = p[lane] * (dot(&do_s[lane * ld], &v_s[r * ld], hs) - d_s[lane]);
                  }
                }
                for (int i = 0; i < kLanes; ++i)
                  for (int lane = 0; lane < kLanes; ++lane)
                    for (int c = 0; c < chunks; ++c) {
                      const int d = lane + kLanes * c;
                      if (d >= hs) continue;
                      dv[at(r, lane, c)] += p[i] * do_s[i * ld + d];
                      dk[at(r, lane, c)] += ds[i] * q_s[i * ld + d];
                    }
              }
          }
        }
        for (int r = 0; r < bc; ++r) {
          const int key = k0 + r;
          if (key >= T) continue;
          for (int lane = 0; lane < kLanes; ++lane)
            for (int c = 0; c < chunks; ++c) {
              const int d = lane + kLanes * c;
              if (d >= hs) continue;
              dqkv[s.k(b, key, kv) + d] = s.scale() * dk[at(r, lane, c)];
              dqkv[s.v(b, key, kv) + d] = dv[at(r, lane, c)];
            }
        }
      }
}

std::vector<float> randn(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// max |got - want| <= tol * max(1, max |want|), the op harness's rule; every element written.
void expect_close(const std::vector<float>& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0, worst = 0.0;
  size_t worst_i = 0;
  for (double x : want) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]);
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst at " << worst_i << " got " << got[worst_i] << " want "
                                << want[worst_i];
}

void check_shape(const Shape& s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "B " << s.B << " T " << s.T << " NH " << s.NH << " NKV " << s.NKV << " hs " << s.hs);
  const auto qkv = randn(static_cast<size_t>(s.B) * s.T * s.R(), seed);
  const auto dout = randn(static_cast<size_t>(s.B) * s.T * s.NH * s.hs, seed + 1);
  const size_t rows = static_cast<size_t>(s.B) * s.NH * s.T;
  // NaN-filled outputs: an element no kernel writes fails the comparison.
  std::vector<float> out(dout.size(), NAN), lse(rows, NAN), dsum(rows, NAN), dqkv(qkv.size(), NAN);
  emulate_forward(out, lse, qkv, s);
  emulate_dq(dqkv, dsum, dout, qkv, lse, s);
  emulate_dkv(dqkv, dout, qkv, lse, dsum, s);
  const Vec Q(qkv.begin(), qkv.end()), D(dout.begin(), dout.end());
  const Vec want_out = ref::gqa_attention(Q, s.B, s.T, s.NH, s.NKV, s.hs);
  expect_close(out, want_out, 1e-5, "out");
  expect_close(lse, ref::gqa_attention_lse(Q, s.B, s.T, s.NH, s.NKV, s.hs), 1e-5, "lse");
  expect_close(dqkv, ref::gqa_attention_grad(Q, D, s.B, s.T, s.NH, s.NKV, s.hs), 1e-5, "dqkv");
  Vec want_d(rows, 0.0);  // D = rowsum(dO * O)
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t)
        for (int d = 0; d < s.hs; ++d) want_d[s.stat(b, h, t)] += D[s.o(b, t, h) + d] * want_out[s.o(b, t, h) + d];
  expect_close(dsum, want_d, 1e-5, "D");
}

TEST(FlashTiles, TileArithmetic) {
  EXPECT_EQ(chunks_for(1), 1);
  EXPECT_EQ(chunks_for(32), 1);
  EXPECT_EQ(chunks_for(33), 2);
  EXPECT_EQ(chunks_for(64), 2);
  EXPECT_EQ(chunks_for(128), 4);
  EXPECT_EQ(chunks_for(kMaxHeadSize), 8);
  for (int hs : {3, 64, 65, 128, 255, 256}) EXPECT_EQ(smem_stride(hs) % 2, 1) << hs;
  EXPECT_EQ(key_tiles_seen(0, 32, 1), 1);     // T = 1: one key tile
  EXPECT_EQ(key_tiles_seen(0, 32, 33), 1);    // rows 0..31 see keys 0..31
  EXPECT_EQ(key_tiles_seen(32, 32, 33), 2);   // row 32 sees key 32: the second tile
  EXPECT_EQ(key_tiles_seen(16, 16, 100), 1);  // rows 16..31
  EXPECT_EQ(key_tiles_seen(32, 16, 100), 2);
  EXPECT_EQ(first_query_tile_seeing(0), 0);
  EXPECT_EQ(first_query_tile_seeing(31), 0);
  EXPECT_EQ(first_query_tile_seeing(32), 1);
  EXPECT_TRUE(sees(5, 5, 6));
  EXPECT_FALSE(sees(5, 6, 7));
  EXPECT_FALSE(sees(6, 0, 6));  // a row past T sees nothing
  // Shared memory within what sm_80 offers a block (163 KiB) for every head size.
  for (int hs = 1; hs <= kMaxHeadSize; ++hs)
    for (int floats : {forward_smem_floats(hs), dq_smem_floats(hs), dkv_smem_floats(hs)})
      EXPECT_LE(floats * 4, 163 * 1024) << hs;
}

// Note [Softmax in base 2, masked only where it must be], Note [Query rows a warp owns] and Note
// [Keys in chunks for dQ] (attention_tensor_cores.cu): by brute force over every T up to five
// blocks, for query blocks of 4 warps owning 16 or 32 rows each, sweeping key tiles of 64 whole
// (forward, and dQ above head size 64) or 16 keys at a time (dQ at 32 rows a warp):
//  - the key tiles a block sweeps hold every key its real rows see, and each (row, key) pair a real
//    row sees is met once;
//  - a span that skips a chunk sees none of it; in the forward, a span that does not skip sees the
//    chunk's first key from every real row (so no row meets a tile it wholly misses, which the
//    online softmax would take as a tile of maximum -inf);
//  - a chunk left unmasked holds no pair a real row does not see; with whole tiles one tile a
//    live span is masked;
// and in dK/dV, for blocks of 64 keys swept by chunks of 64 queries (16 keys a warp) or of 128 keys
// swept by chunks of 16 (32 keys a warp), from the block's first key on: a chunk a span skips adds
// nothing (no real query in it sees a key of the span) and every key pair a real query sees is met;
// a chunk left unmasked is all real queries that see every key of the span.
TEST(FlashTiles, TensorCoreTilesLeftUnmaskedNeedNoMask) {
  constexpr int kTile = 64, kBlockWarps = 4;
  struct QuerySweep {
    int span_rows, chunk;
    bool forward;
  };
  for (const QuerySweep sweep : {QuerySweep{16, 64, true}, QuerySweep{32, 64, true}, QuerySweep{32, 16, false}}) {
    const int span_rows = sweep.span_rows, chunk = sweep.chunk, block_rows = kBlockWarps * span_rows;
    for (int T = 1; T <= 5 * block_rows; ++T)
      for (int q0 = 0; q0 < T; q0 += block_rows) {
        const int key_tiles = key_tiles_seen(q0, block_rows, T, kTile);
        for (int row = q0; row < std::min(T, q0 + block_rows); ++row)
          ASSERT_LT(row / kTile, key_tiles) << "T " << T << " block at " << q0 << ": row " << row;
        for (int row0 = q0; row0 < std::min(T, q0 + block_rows); row0 += span_rows) {
          const int real_end = std::min(T, row0 + span_rows);
          std::vector<int> met(static_cast<size_t>(real_end - row0), 0);  // keys met, per row
          int masked = 0;
          for (int c0 = 0; c0 < key_tiles * kTile; c0 += chunk) {
            const std::string where = "T " + std::to_string(T) + " span at " + std::to_string(row0) + " of " +
                                      std::to_string(span_rows) + ", keys at " + std::to_string(c0);
            if (tc_query_span_sees_none(row0, span_rows, c0)) {
              for (int row = row0; row < real_end; ++row)
                for (int key = c0; key < c0 + chunk; ++key) ASSERT_FALSE(sees(row, key, T)) << where;
              continue;
            }
            if (sweep.forward) {
              for (int row = row0; row < real_end; ++row) ASSERT_TRUE(sees(row, c0, T)) << where << ": row " << row;
            }
            const bool needs_mask = tc_query_span_needs_mask(row0, c0, chunk);
            masked += needs_mask;
            for (int row = row0; row < real_end; ++row)
              for (int key = c0; key < c0 + chunk; ++key) {
                if (!needs_mask) {
                  ASSERT_TRUE(sees(row, key, T)) << where << ": row " << row << ", key " << key;
                }
                met[static_cast<size_t>(row - row0)] += sees(row, key, T);
              }
          }
          for (int row = row0; row < real_end; ++row)
            ASSERT_EQ(met[static_cast<size_t>(row - row0)], row + 1) << "T " << T << " row " << row;
          if (chunk == kTile) {
            EXPECT_EQ(masked, 1) << "T " << T << " span at " << row0 << " of " << span_rows;
          }
        }
      }
  }
  for (const auto [span_keys, chunk] : {std::array<int, 2>{16, 64}, std::array<int, 2>{32, 16}}) {
    const int block_keys = kBlockWarps * span_keys;
    for (int T = 1; T <= 5 * block_keys; ++T)
      for (int k0 = 0; k0 < T; k0 += block_keys)
        for (int key0 = k0; key0 < std::min(T, k0 + block_keys); key0 += span_keys) {
          const int real_keys_end = std::min(T, key0 + span_keys);
          std::vector<int> met(static_cast<size_t>(real_keys_end - key0), 0);  // queries met, per key
          // The sweep: query tiles of 64 from the block's first key, chunk by chunk.
          for (int q0 = k0; q0 < T; q0 += chunk) {
            const std::string where = "T " + std::to_string(T) + " keys at " + std::to_string(key0) + " of " +
                                      std::to_string(span_keys) + ", chunk at " + std::to_string(q0);
            if (tc_key_span_sees_none(key0, q0, chunk, T)) {
              for (int key = key0; key < real_keys_end; ++key)
                for (int query = q0; query < q0 + chunk; ++query) ASSERT_FALSE(sees(query, key, T)) << where;
              continue;
            }
            const bool masked = tc_key_span_needs_mask(key0, span_keys, q0, chunk, T);
            for (int key = key0; key < real_keys_end; ++key)
              for (int query = q0; query < q0 + chunk; ++query) {
                if (!masked) {
                  ASSERT_TRUE(sees(query, key, T)) << where << ": query " << query << ", key " << key;
                }
                met[static_cast<size_t>(key - key0)] += sees(query, key, T);
              }
          }
          for (int key = key0; key < real_keys_end; ++key)  // every query that sees the key was met once
            ASSERT_EQ(met[static_cast<size_t>(key - key0)], T - key) << "T " << T << " key " << key;
        }
  }
}

// Note [Fragments by ldmatrix]: ldmatrix.m8n8.x4 emulated as the PTX ISA describes it, with each
// lane naming the cell flash_tiles.h's functions give it, yields exactly mma.m16n8k16's fragment
// layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane = 4 g + t. A tile cell (row, col)
// holds the value 100 row + col, so a wrong cell cannot go unnoticed.
using ElementPair = std::array<int, 2>;
using LaneRegisters = std::array<std::array<ElementPair, 4>, kLanes>;  // [lane][register]: low, high

int cell_value(int row, int col) { return 100 * row + col; }

// Register i of lane 4 g + t holds elements (g, 2t), (g, 2t + 1) of matrix i (with .trans (2t, g),
// (2t + 1, g)), whose row r starts at the cell lane 8 i + r names.
template <typename CellOf>
LaneRegisters emulate_ldmatrix_x4(CellOf cell_of, bool trans) {
  LaneRegisters regs{};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const auto element = [&](int r, int c) {
        const LaneCell start = cell_of(8 * i + r);
        return cell_value(start.row, start.col + c);
      };
      regs[lane][i] = trans ? ElementPair{element(2 * t, g), element(2 * t + 1, g)}
                            : ElementPair{element(g, 2 * t), element(g, 2 * t + 1)};
    }
  }
  return regs;
}

void expect_registers(const LaneRegisters& got, const LaneRegisters& want, const char* what) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i)
      for (int half = 0; half < 2; ++half)
        EXPECT_EQ(got[lane][i][half], want[lane][i][half]) << what << ": lane " << lane << ", register " << i
                                                           << (half ? ", high half" : ", low half");
}

TEST(FlashTiles, LdmatrixCellsGiveTheMmaFragments) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (const LaneCell c : {a_fragment_cell(lane), b_pair_rows_are_n_cell(lane), b_pair_rows_are_k_cell(lane)}) {
      EXPECT_EQ(c.col % 8, 0) << "each matrix row is 16 aligned bytes: lane " << lane;
      EXPECT_TRUE(c.row >= 0 && c.row < 16 && c.col >= 0 && c.col < 16) << "within the 16 x 16 cells: lane " << lane;
    }
  LaneRegisters a{}, b_rows_are_n{}, b_rows_are_k{};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    // A[m][k] = tile[m][k]: a0..a3 hold rows g, g + 8, g, g + 8 at columns 2t, 2t, 2t + 8, 2t + 8 (and + 1).
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
      a[lane][i] = {cell_value(row, col), cell_value(row, col + 1)};
    }
    // Fragment j of a pair covers B's columns 8 j .. 8 j + 7; its b0 holds B[2t][g], B[2t + 1][g],
    // its b1 B[2t + 8][g], B[2t + 9][g].
    for (int j = 0; j < 2; ++j)
      for (int half_k = 0; half_k < 2; ++half_k) {
        const int k = 2 * t + 8 * half_k, n = 8 * j + g;
        b_rows_are_n[lane][2 * j + half_k] = {cell_value(n, k), cell_value(n, k + 1)};  // B[k][n] = tile[n][k]
        b_rows_are_k[lane][2 * j + half_k] = {cell_value(k, n), cell_value(k + 1, n)};  // B[k][n] = tile[k][n]
      }
  }
  expect_registers(emulate_ldmatrix_x4(a_fragment_cell, false), a, "A fragment");
  expect_registers(emulate_ldmatrix_x4(b_pair_rows_are_n_cell, false), b_rows_are_n, "B pair, tile rows are n");
  expect_registers(emulate_ldmatrix_x4(b_pair_rows_are_k_cell, true), b_rows_are_k, "B pair, tile rows are k");
}

// The reference gradient the emulation is held to, against finite differences of the reference.
TEST(FlashTiles, ReferenceGradientMatchesFiniteDifferences) {
  const int B = 2, T = 4, NH = 4, NKV = 2, hs = 3, R = (NH + 2 * NKV) * hs;
  const auto q = randn(static_cast<size_t>(B) * T * R, 5), w = randn(static_cast<size_t>(B) * T * NH * hs, 6);
  Vec x(q.begin(), q.end());
  const Vec W(w.begin(), w.end()), grad = ref::gqa_attention_grad(x, W, B, T, NH, NKV, hs);
  auto loss = [&](const Vec& xx) {
    const Vec y = ref::gqa_attention(xx, B, T, NH, NKV, hs);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * W[i];
    return l;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i], h = 1e-6;
    x[i] = keep + h;
    const double up = loss(x);
    x[i] = keep - h;
    const double down = loss(x);
    x[i] = keep;
    EXPECT_NEAR(grad[i], (up - down) / (2 * h), 1e-7) << i;
  }
}

TEST(FlashTiles, EmulatedKernelsMatchTheReference) {
  check_shape({1, 1, 2, 1, 3}, 1);     // T = 1, one chunk, odd head size, one kv head
  check_shape({2, 5, 4, 4, 4}, 2);     // GPT-2's attention (NKV = NH)
  check_shape({2, 33, 4, 2, 64}, 3);   // one past a lane tile; groups of 2; hs 64
  check_shape({1, 70, 2, 1, 64}, 4);   // three warp tiles of 32, the last partial
  check_shape({1, 40, 3, 1, 33}, 5);   // groups of 3; two chunks, the second holding one channel
  check_shape({1, 37, 2, 2, 128}, 6);  // hs 128: four chunks
  check_shape({1, 35, 3, 1, 255}, 7);  // eight chunks, 4 rows a warp (warp tile 16), odd
  check_shape({1, 17, 2, 1, 256}, 8);  // the largest head size
}

}  // namespace
}  // namespace zerone::cuda::flash
