// One op harness for every backend (issue 16 §5; after ggml's test-backend-ops): a table of op
// cases, each run on every compiled backend (cpu, sim, and cuda when a GPU and the CUDA backend
// exist; skipped cleanly otherwise) with its operands in that backend's device memory, and checked
//  (a) forward values against the double-precision reference (tests/reference_ops.h);
//  (b) gradients against central finite differences of that reference of L = sum(out * w) for a
//      fixed random w;
//  (c) on every backend but cpu, every operand and returned value bitwise equal to the cpu
//      backend's, the executable spec.
// Tolerances: f32 kernels carry ~1e-6 relative rounding per op; finite differences in double with
// h = 1e-6 are accurate to ~1e-9. Unless a case says otherwise we require
// max |got - want| <= 1e-4 * max(1, max |want|) over a tensor; values that must be exact (copies,
// conversions, padding, untouched memory) are compared bitwise.
// A case reads its parameters as stored (bf16/f16-rounded) and, where the kernel rounds its
// activation operands to the parameter dtype (linear's matmuls), so does its reference.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tests/reference_ops.h"
#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/core/rng.h"
#include "zerone/kernels/backend.h"
#include "zerone/kernels/cpu/adamw.h"
#include "zerone/kernels/cpu/matmul.h"
#ifdef ZERONE_HAVE_CUDA
#include "zerone/kernels/cuda/cuda_backend.h"
#endif
#include "zerone/kernels/sim/sim_backend.h"

#if ZERONE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace zerone::kernels {
namespace {

using ref::Vec;

// ---------------------------------------------------------------- values

std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}
Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
Vec constant(size_t n, double x) { return Vec(n, x); }
Vec plus(Vec v, double x) {
  for (double& e : v) e += x;
  return v;
}
// Values as a parameter of `dtype` stores them (the reference's view of a parameter).
double round_to(double x, DType dtype) {
  return dtype == DType::bf16 ? ref::round_bf16(x) : dtype == DType::f16 ? ref::round_f16(x) : static_cast<float>(x);
}
Vec seen(const Vec& v, DType dtype) {
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = round_to(v[i], dtype);
  return out;
}
Vec seen(const std::vector<float>& v, DType dtype) { return seen(to_double(v), dtype); }
// prefix followed by k ("g" 3: "g3").
std::string named(const char* prefix, size_t k) {
  std::string s(prefix);
  s += std::to_string(k);
  return s;
}
const char* dtype_tag(DType dtype) { return dtype == DType::f32 ? "f32" : dtype == DType::bf16 ? "bf16" : "f16"; }

// Central differences of loss(x) = sum(f(x) * w) with respect to x.
Vec numeric_grad(Vec x, const std::function<Vec(const Vec&)>& f, const Vec& w) {
  const double h = 1e-6;
  Vec g(x.size());
  auto loss = [&](const Vec& xx) {
    Vec y = f(xx);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss(x);
    x[i] = keep - h;
    const double down = loss(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// ---------------------------------------------------------------- the table's vocabulary

// Element type of an operand: how its bytes read as values.
enum class Elem : uint8_t { f32, bf16, f16, i32, opaque };
Elem elem_of(DType dtype) { return dtype == DType::f32 ? Elem::f32 : dtype == DType::bf16 ? Elem::bf16 : Elem::f16; }
size_t elem_size(Elem e) { return e == Elem::bf16 || e == Elem::f16 ? 2 : e == Elem::opaque ? 1 : 4; }

double decode_f16(uint16_t bits) {
  const int sign = bits >> 15, exp = (bits >> 10) & 0x1f, man = bits & 0x3ff;
  double v = exp == 0 ? std::ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : std::ldexp(man + 1024, exp - 25);
  return sign ? -v : v;
}
double decode_bf16(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t encode_f16(double x) { return std::bit_cast<uint16_t>(static_cast<_Float16>(static_cast<float>(x))); }
// bfloat16 bits of a value that is one (round_bf16 first).
uint16_t encode_bf16(double x) {
  const float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// One operand of a case: its initial bytes, uploaded to the backend's device memory before the run.
struct Operand {
  std::string name;
  Elem elem = Elem::f32;
  std::vector<uint8_t> bytes;
};

Operand f32(std::string name, const std::vector<float>& v) {
  Operand o{std::move(name), Elem::f32, std::vector<uint8_t>(v.size() * 4)};
  std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
  return o;
}
Operand fill(std::string name, size_t n, float x) { return f32(std::move(name), std::vector<float>(n, x)); }
Operand i32(std::string name, const std::vector<int32_t>& v) {
  Operand o{std::move(name), Elem::i32, std::vector<uint8_t>(v.size() * 4)};
  std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
  return o;
}
// A parameter stored as `dtype` (values rounded to nearest even).
Operand param(std::string name, const std::vector<float>& v, DType dtype) {
  if (dtype == DType::f32) return f32(std::move(name), v);
  Operand o{std::move(name), elem_of(dtype), std::vector<uint8_t>(v.size() * 2)};
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t bits = dtype == DType::bf16 ? encode_bf16(ref::round_bf16(v[i])) : encode_f16(v[i]);
    std::memcpy(o.bytes.data() + 2 * i, &bits, 2);
  }
  return o;
}
// Backend-private bytes (a workspace): neither checked nor compared across backends.
Operand opaque(std::string name, size_t bytes) { return {std::move(name), Elem::opaque, std::vector<uint8_t>(bytes)}; }

// The device addresses of one run's operands.
class Dev {
 public:
  void* v(const std::string& name) const {
    auto it = ptrs_.find(name);
    ZERONE_ASSERT(it != ptrs_.end(), "no operand ", name);
    return it->second;
  }
  float* f(const std::string& name) const { return static_cast<float*>(v(name)); }
  int32_t* i(const std::string& name) const { return static_cast<int32_t*>(v(name)); }
  std::map<std::string, void*> ptrs_;
};

// One backend's operands after a run (read back to the host), and the host values it returned.
struct Result {
  std::map<std::string, Operand> operands;
  std::vector<double> scalars;
  Vec values(const std::string& name) const {
    const Operand& o = operands.at(name);
    const size_t n = o.bytes.size() / elem_size(o.elem);
    Vec out(n);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* p = o.bytes.data() + i * elem_size(o.elem);
      uint16_t h;
      float f;
      int32_t k;
      switch (o.elem) {
        case Elem::f32: std::memcpy(&f, p, 4), out[i] = f; break;
        case Elem::bf16: std::memcpy(&h, p, 2), out[i] = decode_bf16(h); break;
        case Elem::f16: std::memcpy(&h, p, 2), out[i] = decode_f16(h); break;
        case Elem::i32: std::memcpy(&k, p, 4), out[i] = k; break;
        case Elem::opaque: out[i] = *p; break;
      }
    }
    return out;
  }
};

// What a case expects of an operand ("#k": the k-th returned host value).
enum class Tol : uint8_t {
  scaled,       // max |got - want| <= tol * max(1, max |want|) over the tensor
  per_element,  // |got - want| <= tol * max(1, |want|) for every element
  exact,        // the same values (NaN equals NaN; -0 differs from +0)
};
struct Want {
  std::string what;
  Vec values;
  double tol = 1e-4;
  Tol mode = Tol::scaled;
};
Want close(std::string what, Vec values, double tol = 1e-4) { return {std::move(what), std::move(values), tol, Tol::scaled}; }
Want near_each(std::string what, Vec values, double tol) { return {std::move(what), std::move(values), tol, Tol::per_element}; }
Want exact(std::string what, Vec values) { return {std::move(what), std::move(values), 0.0, Tol::exact}; }

// Note [GEMM operands in the compute dtype] (kernels/backend.h): the 16-bit operand `rounded`
// holds, bit for bit, the f32 operand `full` rounded to nearest even (core/dtype.h's rounding).
// With max_ulps > 0 (a GEMM that rounds as it stores may sum in another order than the one that
// wrote `full`), each element may be that many units in the last place of the 16-bit dtype away.
void expect_rounded_copy(const Result& r, const std::string& full, const std::string& rounded, int max_ulps = 0) {
  const Operand& f = r.operands.at(full);
  const Operand& h = r.operands.at(rounded);
  ASSERT_EQ(f.elem, Elem::f32);
  ASSERT_TRUE(h.elem == Elem::bf16 || h.elem == Elem::f16) << rounded;
  ASSERT_EQ(f.bytes.size(), 2 * h.bytes.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < h.bytes.size() / 2; ++i) {
    float x;
    uint16_t got;
    std::memcpy(&x, f.bytes.data() + 4 * i, 4);
    std::memcpy(&got, h.bytes.data() + 2 * i, 2);
    const uint16_t want = h.elem == Elem::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
    // Same-signed finite 16-bit values are ordered as their bit patterns' magnitudes.
    const int ulps = std::abs(static_cast<int>(got & 0x7fff) - static_cast<int>(want & 0x7fff));
    const bool same_sign = (got & 0x8000) == (want & 0x8000) || ((got | want) & 0x7fff) == 0;
    if ((got != want && (!same_sign || ulps > max_ulps)) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << rounded << " is not " << full << " rounded (within " << max_ulps << " ulps): " << bad
                     << " elements differ, first at " << first;
}
// A 16-bit copy of an operand's initial values as the output of a rounded op would hold them.
Operand rounded(std::string name, const std::vector<float>& v, DType dtype) { return param(std::move(name), v, dtype); }
// An operand of n 16-bit elements of `dtype` filled with the bits of 9.0 (an output to be written).
Operand fill16(std::string name, size_t n, DType dtype) { return param(std::move(name), std::vector<float>(n, 9.0f), dtype); }

// Runs the case's operations on `b` over the device operands; returns host values (losses, sums).
using RunFn = std::function<std::vector<double>(Backend& b, const Dev& d)>;

struct OpCase {
  std::string name;  // [A-Za-z0-9_]: part of the test's name
  std::vector<Operand> operands;
  RunFn run;
  // The expectations from the double reference (evaluated when the case is checked).
  std::function<std::vector<Want>()> reference;
  // Checks that relate operands to each other (may be empty).
  std::function<void(const Result&)> extra = nullptr;
  // Blocked layouts: the channel block the operands were laid out for (0: plain only).
  int block = 0;
  // Attention (Note [Attention's saved state], kernels/backend.h): the operand `att` holds the
  // backend's saved state. On a backend that saves the rows' logsumexp these expectations replace
  // reference()'s of "att", and "att" is not compared with the cpu backend's probabilities.
  std::function<std::vector<Want>()> logsumexp_reference = nullptr;
  // How far the cuda rows' f32 operands may be from the cpu backend's (relative to the operand's
  // largest magnitude): wider where the case lets cuda round products to 16 bits.
  double f32_tolerance_to_cpu = 1e-4;
};

// ---------------------------------------------------------------- running and checking

Result run_on(Backend& b, const OpCase& c) {
  std::vector<Buffer> buffers;
  Dev dev;
  for (const Operand& o : c.operands) {
    buffers.emplace_back(std::max<size_t>(o.bytes.size(), 1), MemCategory::scratch, MemPlace::device, 64,
                         b.device_arena());
    b.copy_to_device(buffers.back().data(), o.bytes.data(), o.bytes.size());
    dev.ptrs_[o.name] = buffers.back().data();
  }
  Result r;
  r.scalars = c.run(b, dev);
  b.synchronize(Stream::compute);
  for (size_t k = 0; k < c.operands.size(); ++k) {
    Operand o = c.operands[k];
    b.copy_to_host(o.bytes.data(), buffers[k].data(), o.bytes.size());
    r.operands.emplace(o.name, std::move(o));
  }
  return r;
}

bool same_value(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

void check(const Result& r, const Want& w) {
  SCOPED_TRACE(w.what);
  const Vec got = w.what[0] == '#' ? Vec{r.scalars.at(std::stoul(w.what.substr(1)))} : r.values(w.what);
  ASSERT_EQ(got.size(), w.values.size());
  if (w.mode == Tol::exact) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!same_value(got[i], w.values[i]) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << w.what << ": " << bad << " values differ, first at " << first << ": got " << got[first]
                       << " want " << w.values[first];
    return;
  }
  double scale = 1.0;
  for (double x : w.values) scale = std::max(scale, std::abs(x));
  double worst = -1.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double limit = w.tol * (w.mode == Tol::scaled ? scale : std::max(1.0, std::abs(w.values[i])));
    const double excess = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - w.values[i]) - limit;
    if (excess > worst) worst = excess, worst_i = i;
  }
  EXPECT_LE(worst, 0.0) << w.what << ": worst at " << worst_i << " got " << got[worst_i] << " want "
                        << w.values[worst_i] << " (tolerance " << w.tol << (w.mode == Tol::scaled ? " scaled" : " each")
                        << ")";
}

// Every operand but opaque ones, and every returned value, bit for bit.
void expect_bitwise_equal(const Result& got, const Result& cpu) {
  for (const auto& [name, o] : cpu.operands) {
    if (o.elem == Elem::opaque) continue;
    const Operand& g = got.operands.at(name);
    ASSERT_EQ(g.bytes.size(), o.bytes.size()) << name;
    size_t first = o.bytes.size();
    for (size_t i = 0; i < o.bytes.size() && first == o.bytes.size(); ++i)
      if (g.bytes[i] != o.bytes[i]) first = i;
    EXPECT_EQ(first, o.bytes.size()) << name << " differs from the cpu backend's from byte " << first;
  }
  ASSERT_EQ(got.scalars.size(), cpu.scalars.size());
  for (size_t k = 0; k < got.scalars.size(); ++k)
    EXPECT_EQ(std::memcmp(&got.scalars[k], &cpu.scalars[k], sizeof(double)), 0)
        << "returned value " << k << ": " << got.scalars[k] << " on the cpu backend " << cpu.scalars[k];
}

// Note [CUDA against the cpu backend]: the GPU sums in other orders (block trees, cuBLASLt's
// tiles), so its results agree with the cpu backend's to rounding, not bit for bit: f32 values
// within 1e-4 of the tensor's scale (the reference tolerance), 16-bit values within two units of
// their last place (a master value one f32 ulp apart may round the other way), integers and
// returned counts exactly. Determinism on the GPU itself is checked by running a case twice.
void expect_close_to_cpu(const Result& got, const Result& cpu, const std::string& skip = "", double f32_tol = 1e-4) {
  for (const auto& [name, o] : cpu.operands) {
    if (o.elem == Elem::opaque || name == skip) continue;
    SCOPED_TRACE(name);
    const Vec want = cpu.values(name), have = got.values(name);
    ASSERT_EQ(have.size(), want.size());
    const double tol = o.elem == Elem::f32 ? f32_tol : o.elem == Elem::bf16 ? 2.0 / 128 : o.elem == Elem::f16 ? 2.0 / 1024 : 0.0;
    double scale = 1.0;
    for (double x : want) scale = std::max(scale, std::abs(x));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool ok = same_value(have[i], want[i]) ||
                      std::abs(have[i] - want[i]) <= tol * (o.elem == Elem::f32 ? scale : std::max(1.0, std::abs(want[i])));
      if (!ok && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << name << ": " << bad << " values differ from the cpu backend's, first at " << first << ": "
                       << have[first] << " on the cpu backend " << want[first];
  }
  ASSERT_EQ(got.scalars.size(), cpu.scalars.size());
  for (size_t k = 0; k < got.scalars.size(); ++k)
    EXPECT_NEAR(got.scalars[k], cpu.scalars[k], 1e-5 * std::max(1.0, std::abs(cpu.scalars[k])))
        << "returned value " << k;
}

// ---------------------------------------------------------------- the cases

std::vector<OpCase> g_cases;
void add(OpCase c) { g_cases.push_back(std::move(c)); }

// --- the engine's own operations

void engine_cases() {
  {  // copy between every pair of places, through the backend
    const size_t n = 1001;
    auto x = randn(n, 100);
    add({"copy_places_n1001",
         {f32("x", x), fill("on_device", n, -1), fill("back", n, -1), fill("any", n, -1)},
         [n](Backend& b, const Dev& d) {
           std::vector<float> host(n, 0.0f), host2(n, 0.0f);
           b.copy_on_device(d.f("on_device"), d.f("x"), n * 4);                                // device -> device
           b.copy_to_host(host.data(), d.f("on_device"), n * 4);                               // device -> host
           b.copy(host2.data(), MemPlace::host, host.data(), MemPlace::host, n * 4);           // host -> host
           b.copy_to_device(d.f("back"), host2.data() + 1, (n - 1) * 4);                       // host -> device, offset
           b.copy(d.f("back") + n - 1, MemPlace::device, host2.data(), MemPlace::host, 4);     // 4 bytes
           b.copy_to_device(d.f("back"), host2.data(), 0);                                     // nothing
           // copy_any: each side's place from place_of (Note [Places of pointers]).
           std::vector<float> host3(n, 0.0f);
           b.copy_any(host3.data(), d.f("x"), n * 4);                                          // device -> host
           b.copy_any(d.f("any"), host3.data(), n * 4);                                        // host -> device
           b.copy_any(d.f("any"), d.f("any") + 1, 4);                                          // device -> device
           // Note [Streams and events]: the copies are done once an event recorded after them is.
           const Event done = b.record(Stream::device_to_host);
           b.wait(Stream::compute, done);
           done.wait();
           b.synchronize(Stream::device_to_host);
           b.synchronize(Stream::host_to_device);
           return std::vector<double>{host2[0], host2[n - 1], double(done.ready())};
         },
         [=] {
           Vec rotated(n);
           for (size_t i = 0; i < n; ++i) rotated[i] = x[(i + 1) % n];
           Vec any = to_double(x);
           any[0] = x[1];
           return std::vector<Want>{exact("on_device", to_double(x)), exact("back", rotated), exact("any", any),
                                    exact("#0", {x[0]}), exact("#1", {x[n - 1]}), exact("#2", {1})};
         }});
  }
  {  // fill_zero of an odd byte range inside a buffer
    const size_t n = 64;
    add({"fill_zero_odd_bytes",
         {fill("x", n, 1.5f)},
         [](Backend& b, const Dev& d) {
           b.fill_zero(reinterpret_cast<char*>(d.f("x")) + 13, 150);  // bytes 13..162
           b.fill_zero(d.f("x"), 0);
           return std::vector<double>{};
         },
         [=] {
           Vec want(n, 1.5);
           for (size_t i = 4; i < 40; ++i) want[i] = 0.0;
           // The partially cleared floats 3 and 40 keep their other bytes: 1.5f is 0x3fc00000.
           float f3 = 1.5f, f40 = 1.5f;
           std::memset(reinterpret_cast<char*>(&f3) + 1, 0, 3);
           std::memset(&f40, 0, 3);
           want[3] = f3, want[40] = f40;
           return std::vector<Want>{exact("x", want)};
         }});
  }
  for (size_t n : {size_t{40001}, size_t{40000}}) {  // 40000: the GPU's four-at-a-time form (launch_binary)
    auto a = randn(n, 101), s = randn(n, 102);
    add({"accumulate_n" + std::to_string(n),
         {f32("dst", a), f32("src", s)},
         [n](Backend& b, const Dev& d) {
           b.accumulate(d.f("dst"), d.f("src"), n);
           b.accumulate(d.f("dst"), d.f("src"), 0);
           return std::vector<double>{};
         },
         [=] {
           Vec want(n);
           for (size_t i = 0; i < n; ++i) want[i] = static_cast<float>(static_cast<double>(a[i]) + s[i]);  // one f32 add
           return std::vector<Want>{exact("dst", want), exact("src", to_double(s))};
         }});
  }
  // Note [Deterministic gradient norm]: sizes below, at and across several norm blocks (16384).
  for (size_t n : {size_t{1}, size_t{16384}, size_t{50001}}) {
    auto x = randn(n, 103 + n, 3.0);
    for (bool copy : {false, true}) {
      add({std::string("sum_squares_n") + std::to_string(n) + (copy ? "_copy_to" : ""),
           {f32("x", x), fill("copy", n, -2.0f)},
           [n, copy](Backend& b, const Dev& d) {
             return std::vector<double>{b.sum_squares(d.f("x"), n, copy ? d.f("copy") : nullptr).value(),
                                        b.sum_squares(d.f("x"), 0).value(), b.sum(d.f("x"), n)};
           },
           [=] {
             double ss = 0, sum = 0;
             for (float v : x) ss += static_cast<double>(v) * v, sum += v;
             return std::vector<Want>{close("#0", {ss}, 1e-12), exact("#1", {0.0}), close("#2", {sum}, 1e-12),
                                      exact("copy", copy ? to_double(x) : constant(n, -2.0)), exact("x", to_double(x))};
           }});
    }
  }
  {  // f32 <-> bf16 / f16, rounding to nearest even, with ties, specials, subnormals and overflow
    std::vector<float> x = randn(301, 104, 10.0);
    const float specials[] = {0.0f, -0.0f, 1.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, 1e-7f, 3e-8f, 1e-9f,
                              65504.0f, 65519.0f, 65520.0f, -70000.0f, 3.389e38f, 3.4e38f, 1.0f + 0x1p-8f,
                              1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 2049.0f, 2051.0f, 0.1f, -1.0f / 3};
    x.insert(x.end(), std::begin(specials), std::end(specials));
    const size_t n = x.size();
    // n = 326 takes cuda's element-wise kernel; its first 324 (a multiple of 4, aligned) the
    // four-at-a-time one (engine.cu): the same bits either way.
    const size_t n4 = n / 4 * 4;
    for (DType dt : {DType::bf16, DType::f16}) {
      add({std::string("convert_f32_") + dtype_tag(dt) + "_and_back",
           {f32("x", x), Operand{"narrow", elem_of(dt), std::vector<uint8_t>(2 * n, 0xff)}, fill("wide", n, -1),
            Operand{"narrow4", elem_of(dt), std::vector<uint8_t>(2 * n4, 0xff)}},
           [n, n4, dt](Backend& b, const Dev& d) {
             b.convert(d.v("narrow"), dt, d.f("x"), DType::f32, n);
             b.convert(d.f("wide"), DType::f32, d.v("narrow"), dt, n);
             b.convert(d.f("wide"), DType::f32, d.v("narrow"), dt, 0);
             b.convert(d.v("narrow4"), dt, d.f("x"), DType::f32, n4);
             return std::vector<double>{};
           },
           [=] {
             const Vec r = seen(x, dt);
             return std::vector<Want>{exact("narrow", r), exact("wide", r), exact("narrow4", Vec(r.begin(), r.begin() + n4))};
           }});
    }
  }
  {
    auto x = randn(777, 105);
    std::vector<float> with_nan = x, with_inf = x;
    with_nan[776] = NAN;
    with_inf[0] = -INFINITY;
    add({"all_finite_n777",
         {f32("x", x), f32("nan", with_nan), f32("inf", with_inf)},
         [](Backend& b, const Dev& d) {
           return std::vector<double>{double(b.all_finite(d.f("x"), 777)), double(b.all_finite(d.f("nan"), 777)),
                                      double(b.all_finite(d.f("inf"), 777)), double(b.all_finite(d.f("nan"), 776)),
                                      double(b.all_finite(d.f("inf"), 0))};
         },
         [] { return std::vector<Want>{exact("#0", {1}), exact("#1", {0}), exact("#2", {0}), exact("#3", {1}), exact("#4", {1})}; }});
  }
}

// --- optimizer updates

// The param copy is the master rounded to its dtype (RNE), bit for bit.
void expect_param_is_rounded_master(const Result& r, DType dt) {
  Vec master = r.values("master"), want(master.size());
  for (size_t i = 0; i < master.size(); ++i) want[i] = round_to(master[i], dt);
  check(r, exact("param", want));
}

void adamw_case(size_t n, DType dt, bool with_param, int steps, float weight_decay, float grad_scale) {
  auto master = randn(n, 200 + n), m0 = randn(n, 201, 0.01), v0 = randn(n, 202, 0.01);
  for (float& v : v0) v = std::abs(v) * 1e-2f;
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < steps; ++s) grads.push_back(randn(n, 210 + s));
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = weight_decay;
  h.grad_scale = grad_scale;
  std::vector<Operand> ops = {f32("master", master), f32("m", m0), f32("v", v0),
                              param("param", std::vector<float>(n, 7.0f), dt)};
  for (int s = 0; s < steps; ++s) ops.push_back(f32(named("g", s), grads[s]));
  add({std::string("adamw_n") + std::to_string(n) + "_" + (with_param ? dtype_tag(dt) : "noparam") + "_steps" +
           std::to_string(steps) + (weight_decay > 0 ? "_wd" : "") + (grad_scale != 1 ? "_scaled" : ""),
       ops,
       [=](Backend& b, const Dev& d) {
         std::vector<double> sums;
         for (int s = 0; s < steps; ++s) {
           AdamWHyper hs = h;
           hs.step = s + 1;
           sums.push_back(b.adamw_update(d.f("master"), d.f("m"), d.f("v"), d.f(named("g", s)),
                                         with_param ? d.v("param") : nullptr, dt, n, hs)
                             .value());
         }
         return sums;
       },
       [=] {
         Vec p = to_double(master), m = to_double(m0), v = to_double(v0);
         ref::AdamWRef rh;
         rh.lr = h.lr, rh.weight_decay = h.weight_decay, rh.grad_scale = h.grad_scale;
         std::vector<Want> wants;
         for (int s = 0; s < steps; ++s) {
           const Vec g = to_double(grads[s]);
           ref::adamw_step(p, m, v, g, rh, s + 1);
           double ss = 0;
           for (double x : g) ss += x * x;
           wants.push_back(close(named("#", s), {ss}, 1e-9));
           wants.push_back(exact(named("g", s), g));  // gradients are only read
         }
         wants.push_back(near_each("master", p, 1e-5));
         wants.push_back(near_each("m", m, 1e-6));
         wants.push_back(near_each("v", v, 1e-6));
         if (!with_param) wants.push_back(exact("param", seen(std::vector<float>(n, 7.0f), dt)));
         return wants;
       },
       [=](const Result& r) {
         if (with_param) expect_param_is_rounded_master(r, dt);
       }});
}

void sgd_case(size_t n, DType dt, bool with_param, float momentum, float dampening, bool nesterov, float weight_decay,
              float grad_scale) {
  const int steps = 3;
  auto master = randn(n, 300 + n);
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < steps; ++s) grads.push_back(randn(n, 310 + s));
  SGDHyper h;
  h.lr = 0.05f;
  h.momentum = momentum;
  h.dampening = dampening;
  h.nesterov = nesterov;
  h.weight_decay = weight_decay;
  h.grad_scale = grad_scale;
  std::vector<Operand> ops = {f32("master", master), fill("momentum", n, 1e30f),
                              param("param", std::vector<float>(n, 7.0f), dt)};
  for (int s = 0; s < steps; ++s) ops.push_back(f32(named("g", s), grads[s]));
  std::string name = std::string("sgd_n") + std::to_string(n) + "_" + (with_param ? dtype_tag(dt) : "noparam");
  if (momentum > 0) name += nesterov ? "_nesterov" : dampening > 0 ? "_momentum_dampened" : "_momentum";
  if (weight_decay > 0) name += "_wd";
  if (grad_scale != 1) name += "_scaled";
  add({name, ops,
       [=](Backend& b, const Dev& d) {
         std::vector<double> sums;
         for (int s = 0; s < steps; ++s) {
           SGDHyper hs = h;
           hs.first = s == 0;
           sums.push_back(b.sgd_update(d.f("master"), momentum > 0 ? d.f("momentum") : nullptr,
                                       d.f(named("g", s)), with_param ? d.v("param") : nullptr, dt, n, hs)
                             .value());
         }
         return sums;
       },
       [=] {
         Vec p = to_double(master), buf(n, 0.0);
         ref::SGDRef rh;
         rh.lr = h.lr, rh.momentum = h.momentum, rh.dampening = h.dampening, rh.nesterov = h.nesterov;
         rh.weight_decay = h.weight_decay, rh.grad_scale = h.grad_scale;
         std::vector<Want> wants;
         for (int s = 0; s < steps; ++s) {
           const Vec g = to_double(grads[s]);
           ref::sgd_step(p, buf, g, rh, s == 0);
           double ss = 0;
           for (double x : g) ss += x * x;
           wants.push_back(close(named("#", s), {ss}, 1e-9));
           wants.push_back(exact(named("g", s), g));
         }
         wants.push_back(near_each("master", p, 1e-5));
         wants.push_back(momentum > 0 ? near_each("momentum", buf, 1e-5) : exact("momentum", constant(n, 1e30f)));
         if (!with_param) wants.push_back(exact("param", seen(std::vector<float>(n, 7.0f), dt)));
         return wants;
       },
       [=](const Result& r) {
         if (with_param) expect_param_is_rounded_master(r, dt);
       }});
}

void optimizer_cases() {
  adamw_case(1000, DType::bf16, true, 5, 0.1f, 0.5f);  // PyTorch's AdamW over several steps
  adamw_case(1003, DType::f32, false, 2, 0.0f, 1.0f);  // f32 training: the master is the parameter
  adamw_case(1003, DType::f32, true, 2, 0.1f, 1.0f);
  adamw_case(517, DType::f16, true, 3, 0.01f, 0.25f);
  adamw_case(1, DType::bf16, true, 1, 0.0f, 1.0f);
  adamw_case(2 * 16384 + 1777, DType::bf16, true, 2, 0.1f, 1.0f);  // three chunks, the last partial (Note [Loads in flight])
  sgd_case(1001, DType::f32, false, 0.0f, 0.0f, false, 0.0f, 1.0f);  // plain SGD, no momentum buffer
  sgd_case(1001, DType::bf16, true, 0.9f, 0.0f, false, 0.01f, 1.0f);
  sgd_case(1001, DType::f16, true, 0.9f, 0.1f, false, 0.0f, 0.5f);
  sgd_case(333, DType::f32, true, 0.9f, 0.0f, true, 0.01f, 1.0f);
  sgd_case(1, DType::bf16, true, 0.5f, 0.0f, true, 0.0f, 2.0f);
  sgd_case(16384 + 1333, DType::f32, true, 0.9f, 0.0f, false, 0.01f, 1.0f);  // two chunks (Note [Loads in flight])
}

// --- the transformers

void embedding_case(int B, int T, int C, int V, DType dt, bool with_wpe, uint64_t seed) {
  const int maxT = T + 1;
  std::vector<int32_t> tokens(B * T);
  Rng rng(seed);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(V));
  if (B * T > 2) tokens[2] = tokens[0];  // a repeat: the scatter must add
  auto wte = randn(V * C, seed + 1), wpe = randn(maxT * C, seed + 2), dout = randn(B * T * C, seed + 3);
  const size_t out_n = static_cast<size_t>(B) * T * C;
  add({std::string("embedding_B") + std::to_string(B) + named("_T", T) + named("_C", C) + "_V" +
           std::to_string(V) + "_" + dtype_tag(dt) + (with_wpe ? "" : "_no_wpe"),
       {i32("tokens", tokens), param("wte", wte, dt), param("wpe", wpe, dt), fill("out", out_n, 9.0f),
        f32("dout", dout), fill("dwte", V * C, 0.5f), fill("dwpe", maxT * C, 0.25f)},
       [=](Backend& b, const Dev& d) {
         b.embedding_forward(d.f("out"), d.i("tokens"), d.v("wte"), with_wpe ? d.v("wpe") : nullptr, dt, B, T, C, V);
         b.embedding_backward(d.f("dwte"), with_wpe ? d.f("dwpe") : nullptr, d.f("dout"), d.i("tokens"), B, T, C, V);
         return std::vector<double>{};
       },
       [=] {
         const Vec E = seen(wte, dt), P = with_wpe ? seen(wpe, dt) : constant(maxT * C, 0.0), D = to_double(dout);
         auto f = [&](const Vec& e, const Vec& p) { return ref::embedding(tokens, e, p, B, T, C); };
         std::vector<Want> w = {close("out", f(E, P)),
                                close("dwte", plus(numeric_grad(E, [&](const Vec& e) { return f(e, P); }, D), 0.5))};
         w.push_back(with_wpe ? close("dwpe", plus(numeric_grad(P, [&](const Vec& p) { return f(E, p); }, D), 0.25))
                              : exact("dwpe", constant(maxT * C, 0.25)));
         return w;
       }});
}

void layernorm_case(int N, int C, DType dt, uint64_t seed) {
  auto inp = randn(N * C, seed, 2.0), w = randn(C, seed + 1), bias = randn(C, seed + 2), dout = randn(N * C, seed + 3);
  // With 16-bit parameters forward also writes its output rounded to them ("out16": Note [GEMM
  // operands in the compute dtype]), which must be "out" rounded.
  const bool rounds = dt != DType::f32;
  std::vector<Operand> ops = {f32("inp", inp), param("weight", w, dt), param("bias", bias, dt), fill("out", N * C, 9),
                              fill("mean", N, 9), fill("rstd", N, 9), f32("dout", dout), fill("dinp", N * C, 1.0f),
                              fill("dweight", C, 0.5f), fill("dbias", C, 0.25f)};
  if (rounds) ops.push_back(fill16("out16", N * C, dt));
  add({named("layernorm_N", N) + named("_C", C) + "_" + dtype_tag(dt), ops,
       [=](Backend& b, const Dev& d) {
         b.layernorm_forward(d.f("out"), DType::f32, d.f("mean"), d.f("rstd"), d.f("inp"), d.v("weight"), d.v("bias"),
                             dt, N, C);
         if (rounds)
           b.layernorm_forward(d.v("out16"), dt, d.f("mean"), d.f("rstd"), d.f("inp"), d.v("weight"), d.v("bias"), dt,
                               N, C);
         b.layernorm_backward(d.f("dinp"), d.f("dweight"), d.f("dbias"), d.f("dout"), d.f("inp"), d.v("weight"), dt,
                              d.f("mean"), d.f("rstd"), N, C);
         return std::vector<double>{};
       },
       [=] {
         const Vec X = to_double(inp), W = seen(w, dt), Bv = seen(bias, dt), D = to_double(dout);
         Vec mean, rstd;
         ref::layernorm_stats(X, N, C, mean, rstd);
         // dinp, dweight and dbias accumulate onto 1.0, 0.5 and 0.25.
         return std::vector<Want>{
             close("out", ref::layernorm(X, W, Bv, N, C)), close("mean", mean), close("rstd", rstd),
             close("dinp", plus(numeric_grad(X, [&](const Vec& x) { return ref::layernorm(x, W, Bv, N, C); }, D), 1.0)),
             close("dweight", plus(numeric_grad(W, [&](const Vec& ww) { return ref::layernorm(X, ww, Bv, N, C); }, D), 0.5)),
             close("dbias", plus(numeric_grad(Bv, [&](const Vec& bb) { return ref::layernorm(X, W, bb, N, C); }, D), 0.25))};
       },
       [=](const Result& r) {
         if (rounds) expect_rounded_copy(r, "out", "out16");
       }});
}

void rmsnorm_case(int N, int C, DType dt, uint64_t seed) {
  const float eps = 1e-6f;
  auto inp = randn(N * C, seed, 2.0), w = randn(C, seed + 1), dout = randn(N * C, seed + 2);
  const bool rounds = dt != DType::f32;  // as layernorm_case
  std::vector<Operand> ops = {f32("inp", inp), param("weight", w, dt), fill("out", N * C, 9), fill("rstd", N, 9),
                              f32("dout", dout), fill("dinp", N * C, 1.0f), fill("dweight", C, 0.5f)};
  if (rounds) ops.push_back(fill16("out16", N * C, dt)), ops.push_back(fill16("dinp16", N * C, dt));
  add({named("rmsnorm_N", N) + named("_C", C) + "_" + dtype_tag(dt), ops,
       [=](Backend& b, const Dev& d) {
         b.rmsnorm_forward(d.f("out"), DType::f32, d.f("rstd"), d.f("inp"), d.v("weight"), dt, N, C, eps);
         if (rounds) b.rmsnorm_forward(d.v("out16"), dt, d.f("rstd"), d.f("inp"), d.v("weight"), dt, N, C, eps);
         // A 16-bit run's backward also stores the new dinp rounded (Note [Gradients rounded where
         // they are made]).
         b.rmsnorm_backward(d.f("dinp"), d.f("dweight"), d.f("dout"), d.f("inp"), d.v("weight"), dt, d.f("rstd"), N, C,
                            rounds ? d.v("dinp16") : nullptr, dt);
         return std::vector<double>{};
       },
       [=] {
         const Vec X = to_double(inp), W = seen(w, dt), D = to_double(dout);
         return std::vector<Want>{
             close("out", ref::rmsnorm(X, W, N, C, eps)), close("rstd", ref::rmsnorm_rstd(X, N, C, eps)),
             close("dinp", plus(numeric_grad(X, [&](const Vec& x) { return ref::rmsnorm(x, W, N, C, eps); }, D), 1.0)),
             close("dweight", plus(numeric_grad(W, [&](const Vec& ww) { return ref::rmsnorm(X, ww, N, C, eps); }, D), 0.5))};
       },
       [=](const Result& r) {
         if (!rounds) return;
         expect_rounded_copy(r, "out", "out16");
         expect_rounded_copy(r, "dinp", "dinp16");
       }});
}

// Linear: forward, then backward. bf16 runs its matmuls on bf16-rounded activations and output
// gradients (f32 accumulation), f16 on f16-rounded ones in f32 (ops.h): the reference rounds the
// same operands and is then held to the f32 tolerance. The bias gradient sums unrounded dout.
void linear_case(int N, int C, int OC, DType dt, bool with_bias, bool accumulate, bool with_dinp, uint64_t seed,
                 double forward_tol = 1e-4) {
  auto inp = randn(N * C, seed), w = randn(OC * C, seed + 1), bias = randn(OC, seed + 2), dout = randn(N * OC, seed + 3);
  const float dw0 = accumulate ? 0.5f : 1e30f, db0 = accumulate ? 0.25f : 1e30f;
  add({named("linear_N", N) + named("_C", C) + named("_OC", OC) + "_" + dtype_tag(dt) +
           (with_bias ? "_bias" : "_nobias") + (accumulate ? "_accumulate" : "_fresh") + (with_dinp ? "" : "_no_dinp"),
       {f32("inp", inp), param("weight", w, dt), param("bias", bias, dt), fill("out", N * OC, 9), f32("dout", dout),
        fill("dinp", N * C, 3.0f), fill("dweight", OC * C, dw0), fill("dbias", OC, db0)},
       [=](Backend& b, const Dev& d) {
         b.linear_forward(d.f("out"), DType::f32, d.f("inp"), DType::f32, d.v("weight"), with_bias ? d.v("bias") : nullptr, dt, N, C,
                          OC);
         b.linear_backward(with_dinp ? d.f("dinp") : nullptr, d.f("dweight"), with_bias ? d.f("dbias") : nullptr,
                           d.f("dout"), DType::f32, d.f("inp"), DType::f32, d.v("weight"), dt, N, C, OC, accumulate);
         return std::vector<double>{};
       },
       [=] {
         const Vec X = seen(inp, dt), W = seen(w, dt), Bv = with_bias ? seen(bias, dt) : Vec{}, D = to_double(dout),
                   Dr = seen(dout, dt);
         auto f = [&](const Vec& x, const Vec& ww, const Vec& bb) { return ref::linear(x, ww, bb, N, C, OC); };
         std::vector<Want> want = {close("out", f(X, W, Bv), forward_tol)};
         want.push_back(with_dinp ? close("dinp", numeric_grad(to_double(inp), [&](const Vec& x) { return f(x, W, Bv); }, Dr))
                                  : exact("dinp", constant(N * C, 3.0)));
         want.push_back(close("dweight", plus(numeric_grad(W, [&](const Vec& ww) { return f(X, ww, Bv); }, Dr),
                                              accumulate ? 0.5 : 0.0)));
         if (with_bias)
           want.push_back(close("dbias", plus(numeric_grad(Bv, [&](const Vec& bb) { return f(X, W, bb); }, D),
                                              accumulate ? 0.25 : 0.0)));
         else
           want.push_back(exact("dbias", constant(OC, db0)));
         return want;
       }});
}

// Note [GELU's backward in the linear's] (kernels/backend.h): linear_backward_through_gelu gives
// the bits of gelu_backward then linear_backward (the "_r" operands), on every backend; against
// the reference, its gradients are those of the linear with dout = gelu'(pre) dgelu. dgelu, which
// the call may overwrite, is opaque (neither checked nor compared across backends).
void linear_through_gelu_case(int N, int C, int OC, DType dt, bool accumulate, bool with_dinp, uint64_t seed) {
  auto inp = randn(N * C, seed), w = randn(OC * C, seed + 1), pre = randn(N * OC, seed + 2, 2.0),
       dgelu = randn(N * OC, seed + 3);
  const float dw0 = accumulate ? 0.5f : 1e30f, db0 = accumulate ? 0.25f : 1e30f;
  std::vector<Operand> ops = {f32("inp", inp), param("weight", w, dt), param("pre", pre, dt)};
  for (const char* tag : {"", "_r"}) {
    Operand g = f32(std::string("dgelu") + tag, dgelu);
    g.elem = Elem::opaque;
    ops.push_back(g);
    ops.push_back(fill(std::string("dinp") + tag, N * C, 3.0f));
    ops.push_back(fill(std::string("dweight") + tag, OC * C, dw0));
    ops.push_back(fill(std::string("dbias") + tag, OC, db0));
  }
  add({named("linear_through_gelu_N", N) + named("_C", C) + named("_OC", OC) + "_" + dtype_tag(dt) +
           (accumulate ? "_accumulate" : "_fresh") + (with_dinp ? "" : "_no_dinp"),
       ops,
       [=](Backend& b, const Dev& d) {
         b.linear_backward_through_gelu(with_dinp ? d.f("dinp") : nullptr, d.f("dweight"), d.f("dbias"), d.f("dgelu"),
                                        d.v("pre"), dt, d.f("inp"), DType::f32, d.v("weight"), dt, N, C, OC, accumulate);
         b.gelu_backward(d.f("dgelu_r"), d.v("pre"), dt, d.f("dgelu_r"), static_cast<size_t>(N) * OC);
         b.linear_backward(with_dinp ? d.f("dinp_r") : nullptr, d.f("dweight_r"), d.f("dbias_r"), d.f("dgelu_r"),
                           DType::f32, d.f("inp"), DType::f32, d.v("weight"), dt, N, C, OC, accumulate);
         return std::vector<double>{};
       },
       [=] {
         // dout in double: the backends round their f32 dout to dt for the GEMMs, the reference its
         // double one, which may land an ulp of dt apart: the GEMMs' gradients get dt's tolerance.
         // The linear's gradients written out (linear_case holds them to central differences):
         // dinp = Dr W, dweight = Dr^T X, dbias = the column sums of dout.
         const Vec X = seen(inp, dt), W = seen(w, dt), P = seen(pre, dt);
         Vec dout(P.size());  // GELU is elementwise: its central difference element by element
         for (size_t i = 0; i < P.size(); ++i) dout[i] = numeric_grad(Vec{P[i]}, ref::gelu, Vec{dgelu[i]})[0];
         const Vec Dr = seen(dout, dt);
         const double tol = dt == DType::f32 ? 1e-4 : 1e-2;
         Vec dx(static_cast<size_t>(N) * C, 0.0), dw(static_cast<size_t>(OC) * C, accumulate ? 0.5 : 0.0),
             db(OC, accumulate ? 0.25 : 0.0);
         for (int n = 0; n < N; ++n)
           for (int o = 0; o < OC; ++o) {
             const double g = Dr[static_cast<size_t>(n) * OC + o];
             db[o] += dout[static_cast<size_t>(n) * OC + o];
             for (int c = 0; c < C; ++c) {
               dx[static_cast<size_t>(n) * C + c] += g * W[static_cast<size_t>(o) * C + c];
               dw[static_cast<size_t>(o) * C + c] += g * X[static_cast<size_t>(n) * C + c];
             }
           }
         return std::vector<Want>{with_dinp ? close("dinp", dx, tol) : exact("dinp", constant(N * C, 3.0)),
                                  close("dweight", dw, tol), close("dbias", db)};
       },
       [](const Result& r) {
         for (const char* name : {"dinp", "dweight", "dbias"}) {
           SCOPED_TRACE(name);
           EXPECT_EQ(r.operands.at(name).bytes, r.operands.at(std::string(name) + "_r").bytes)
               << "linear_backward_through_gelu differs from gelu_backward then linear_backward";
         }
       }});
}

// Note [GEMM operands in the compute dtype]: linear on operands already rounded to the weights'
// 16-bit dtype gives the bits it gives on the f32 operands (which it rounds itself). The bias
// gradient needs dout in f32, so with a bias only inp comes rounded.
void linear_rounded_operands_case(int N, int C, int OC, DType dt, bool with_bias, uint64_t seed) {
  auto inp = randn(N * C, seed), w = randn(OC * C, seed + 1), bias = randn(OC, seed + 2), dout = randn(N * OC, seed + 3);
  std::vector<Operand> ops = {f32("inp", inp), rounded("inp16", inp, dt), param("weight", w, dt),
                              param("bias", bias, dt), f32("dout", dout), rounded("dout16", dout, dt),
                              fill16("out16", N * OC, dt)};
  for (const char* tag : {"", "_r"}) {
    ops.push_back(fill(std::string("out") + tag, N * OC, 9));
    ops.push_back(fill(std::string("dinp") + tag, N * C, 3.0f));
    ops.push_back(fill(std::string("dweight") + tag, OC * C, 0.5f));
    ops.push_back(fill(std::string("dbias") + tag, OC, 0.25f));
  }
  add({named("linear_rounded_operands_N", N) + named("_C", C) + named("_OC", OC) + "_" + dtype_tag(dt) +
           (with_bias ? "_bias" : "_nobias"),
       ops,
       [=](Backend& b, const Dev& d) {
         const void* bias_p = with_bias ? d.v("bias") : nullptr;
         b.linear_forward(d.f("out"), DType::f32, d.f("inp"), DType::f32, d.v("weight"), bias_p, dt, N, C, OC);
         b.linear_backward(d.f("dinp"), d.f("dweight"), with_bias ? d.f("dbias") : nullptr, d.f("dout"), DType::f32,
                           d.f("inp"), DType::f32, d.v("weight"), dt, N, C, OC);
         b.linear_forward(d.f("out_r"), DType::f32, d.v("inp16"), dt, d.v("weight"), bias_p, dt, N, C, OC);
         // Note [Logits in the compute dtype]: the output stored in the weights' dtype.
         b.linear_forward(d.v("out16"), dt, d.v("inp16"), dt, d.v("weight"), bias_p, dt, N, C, OC);
         b.linear_backward(d.f("dinp_r"), d.f("dweight_r"), with_bias ? d.f("dbias_r") : nullptr,
                           with_bias ? d.v("dout") : d.v("dout16"), with_bias ? DType::f32 : dt, d.v("inp16"), dt,
                           d.v("weight"), dt, N, C, OC);
         return std::vector<double>{};
       },
       [=] {
         const Vec X = seen(inp, dt), W = seen(w, dt), Bv = with_bias ? seen(bias, dt) : Vec{};
         const Vec want = ref::linear(X, W, Bv, N, C, OC);
         return std::vector<Want>{close("out", want), close("out16", want, 4e-3)};
       },
       [](const Result& r) {
         expect_rounded_copy(r, "out", "out16", /*max_ulps=*/1);
         for (const char* name : {"out", "dinp", "dweight", "dbias"}) {
           SCOPED_TRACE(name);
           EXPECT_EQ(r.operands.at(name).bytes, r.operands.at(std::string(name) + "_r").bytes)
               << "linear on rounded operands differs from linear on f32 ones";
         }
       }});
}

// Note [oneDNN 2.6 AMX column tails]: small-row bf16 GEMMs with 49..63 output columns came out
// wrong on AMX CPUs with two threads. Every column count 1..80 must match the reference.
void linear_bf16_columns_case() {
  const int N = 16, C = 32, maxOC = 80;
  auto inp = randn(N * C, 90);
  std::vector<std::vector<float>> ws;
  std::vector<Operand> ops = {f32("inp", inp)};
  for (int OC = 1; OC <= maxOC; ++OC) {
    ws.push_back(randn(OC * C, 1000 + OC));
    ops.push_back(param(named("w", OC), ws.back(), DType::bf16));
    ops.push_back(fill(named("out", OC), N * OC, 9));
  }
  add({"linear_bf16_columns_1_to_80", ops,
       [=](Backend& b, const Dev& d) {
         const int threads = omp_get_max_threads();
         omp_set_num_threads(2);
         for (int OC = 1; OC <= maxOC; ++OC)
           b.linear_forward(d.f(named("out", OC)), DType::f32, d.f("inp"), DType::f32, d.v(named("w", OC)), nullptr,
                            DType::bf16, N, C, OC);
         omp_set_num_threads(threads);
         return std::vector<double>{};
       },
       [=] {
         std::vector<Want> want;
         const Vec X = seen(inp, DType::bf16);
         for (int OC = 1; OC <= maxOC; ++OC)
           want.push_back(close(named("out", OC), ref::linear(X, seen(ws[OC - 1], DType::bf16), {}, N, C, OC), 1e-5));
         return want;
       }});
}

// Attention (NKV == 0: GPT-2's attention_forward over qkv (B,T,3C), C = NH * hs) or grouped-query
// attention with NKV key/value heads. The gradient from finite differences of the reference, or
// past a few thousand inputs from the reference's chain rule (ref::gqa_attention_grad, itself held
// to finite differences by tests/kernels/flash_tiles_test.cc).
// Note [Flash attention rows]: the cuda backend runs these with its flash kernels (saving the
// logsumexp) and, as the `cuda_plain` rows, with its plain ones; the shapes from T 17 up cut the
// flash tiles (flash_tiles.h) short: T one past a lane tile of 32, a last partial warp tile,
// head sizes of 1, 2, 4 and 8 chunks of 32 channels, odd ones, GQA groups of 2 and 3.
// operands bf16 / f16 (the `_bf16ops` / `_f16ops` rows): the model computes in 16 bits, so qkv
// and out are stored in 16 bits (Note [Attention's inputs and output in the compute dtype]): the
// reference takes the rounded qkv, out is held to a 16-bit tolerance; cuda runs Note [Flash
// attention on tensor cores] where it is built for the head size, cpu and sim compute in f32 on the
// widened qkv (kernels/backend.h).
void attention_case(int B, int T, int NH, int NKV, int hs, uint64_t seed, DType operands = DType::f32) {
  const bool gqa = NKV > 0;
  const int KV = gqa ? NKV : NH, R = (NH + 2 * KV) * hs, C = NH * hs;
  auto qkv = randn(B * T * R, seed), dout = randn(B * T * C, seed + 1);
  std::string name = gqa ? "gqa_attention_B" : "attention_B";
  name += std::to_string(B) + named("_T", T) + named("_NH", NH) +
          (gqa ? named("_NKV", NKV) : "") + named("_hs", hs);
  // 16-bit operands round q, k, v, P, dO and dS (8 or 11 significant bits): errors of a few parts
  // in a thousand of the largest value, a few hundredths of a unit in the logsumexp.
  const double tol = operands == DType::bf16 ? 3e-2 : operands == DType::f16 ? 5e-3 : 1e-4;
  const double lse_tol = operands == DType::bf16 ? 5e-2 : operands == DType::f16 ? 1e-2 : 1e-4;
  if (operands != DType::f32) name += std::string("_") + dtype_name(operands) + "ops";
  const bool stored16 = operands != DType::f32;
  add({name,
       {stored16 ? param("qkv", qkv, operands) : f32("qkv", qkv),
        stored16 ? fill16("out", B * T * C, operands) : fill("out", B * T * C, 9), fill("att", B * NH * T * T, 9),
        f32("dout", dout), fill("dqkv", B * T * R, 7.0f)},  // dqkv is overwritten
       [=](Backend& b, const Dev& d) {
         if (gqa) {
           b.gqa_attention_forward(d.v("out"), d.f("att"), d.v("qkv"), B, T, NH, NKV, hs, operands);
           b.gqa_attention_backward(d.f("dqkv"), d.f("dout"), d.v("qkv"), d.v("out"), d.f("att"), B, T, NH, NKV, hs,
                                    operands);
         } else {
           b.attention_forward(d.v("out"), d.f("att"), d.v("qkv"), B, T, C, NH, operands);
           b.attention_backward(d.f("dqkv"), d.f("dout"), d.v("qkv"), d.v("out"), d.f("att"), B, T, C, NH, operands);
         }
         return std::vector<double>{};
       },
       [=] {
         const Vec Q = seen(qkv, operands), D = to_double(dout);
         auto f = [&](const Vec& q) {
           return gqa ? ref::gqa_attention(q, B, T, NH, NKV, hs) : ref::attention(q, B, T, C, NH);
         };
         const bool small = Q.size() <= 2000;
         return std::vector<Want>{
             close("out", f(Q), tol), close("att", ref::gqa_attention_probs(Q, B, T, NH, KV, hs)),
             close("dqkv", small ? numeric_grad(Q, f, D) : ref::gqa_attention_grad(Q, D, B, T, NH, KV, hs), tol)};
       },
       nullptr, 0,
       [=] {
         // The rows' logsumexp (B,NH,T) at the start of att, the rest of it untouched.
         Vec want = ref::gqa_attention_lse(seen(qkv, operands), B, T, NH, KV, hs);
         want.resize(static_cast<size_t>(B) * NH * T * T, 9.0);
         return std::vector<Want>{near_each("att", want, lse_tol)};
       },
       tol});
}

// Rotary embeddings on the first `heads` heads of rows of `stride` floats; forward in place on x,
// backward in place on dx. scaled: llama3 frequencies (factor 8, original context 64, so that the
// kept, blended and divided branches all occur at hs 8).
// dt: x's dtype in forward (Note [Attention's inputs and output in the compute dtype]: a 16-bit
// qkv is rotated in f32 and stored rounded); dx stays f32.
void rope_case(int B, int T, int heads, int stride_heads, int hs, bool scaled, uint64_t seed, DType dt = DType::f32) {
  const int stride = stride_heads * hs;
  const float theta = 10000.0f;
  RopeScaling s;
  if (scaled) s.factor = 8.0f, s.low_freq_factor = 1.0f, s.high_freq_factor = 4.0f, s.original_max_position = 64;
  std::vector<float> inv_freq(hs / 2);
  rope_inv_freq(inv_freq.data(), hs, theta, s);
  auto x = randn(B * T * stride, seed), dout = randn(B * T * stride, seed + 1);
  add({named("rope_B", B) + named("_T", T) + named("_heads", heads) + "_of" +
           std::to_string(stride_heads) + named("_hs", hs) + (scaled ? "_llama3" : "_plain") +
           (dt == DType::f32 ? "" : std::string("_") + dtype_tag(dt)),
       {f32("inv_freq", inv_freq), dt == DType::f32 ? f32("x", x) : param("x", x, dt), f32("dx", dout),
        f32("dx_read", dout), dt == DType::f32 ? fill("dx16", 1, 0.0f) : fill16("dx16", B * T * stride, dt)},
       [=](Backend& b, const Dev& d) {
         b.rope_forward(d.v("x"), dt, d.f("inv_freq"), B, T, stride, heads, hs);
         b.rope_backward(d.f("dx"), d.f("inv_freq"), B, T, stride, heads, hs, nullptr, DType::f32);
         // A 16-bit run's backward out of place into a rounded copy of every row (Note [Gradients
         // rounded where they are made]): dx_read only read.
         if (dt != DType::f32)
           b.rope_backward(d.f("dx_read"), d.f("inv_freq"), B, T, stride, heads, hs, d.v("dx16"), dt);
         return std::vector<double>{};
       },
       [=] {
         // The table is the model's (f32, rope_inv_freq); RopeInvFreq checks it against the rule.
         const Vec f = to_double(inv_freq), X = seen(x, dt);
         auto r = [&](const Vec& xx) { return ref::rope(xx, f, B, T, stride, heads, hs); };
         return std::vector<Want>{close("x", r(X), dt == DType::f32 ? 1e-4 : 1e-2),
                                  close("dx", numeric_grad(to_double(x), r, to_double(dout))), exact("inv_freq", f),
                                  exact("dx_read", to_double(dout))};
       },
       [=](const Result& r) {
         // Heads past `heads` (the values of a qkv row) are untouched, bit for bit.
         const Vec got = r.values("x"), dgot = r.values("dx");
         size_t changed = 0;
         const Vec x0 = seen(x, dt);  // what x held (rounded when 16-bit)
         for (int row = 0; row < B * T; ++row)
           for (int i = heads * hs; i < stride; ++i)
             changed += got[row * stride + i] != x0[row * stride + i] || dgot[row * stride + i] != dout[row * stride + i];
         EXPECT_EQ(changed, 0u) << "rope changed heads past the rotated ones";
         if (dt != DType::f32) expect_rounded_copy(r, "dx", "dx16");
       }});
}

// `rounded_dt` (bf16 or f16; f32: none): forward and backward also write their outputs rounded to
// it (Note [GEMM operands in the compute dtype]), which must be the f32 outputs rounded.
// `inp_dt`: the input's dtype (Note [The MLP's hidden activation in the compute dtype]: a 16-bit
// run's GEMM hands the activation its output rounded); the reference sees the rounded values.
void swiglu_case(int N, int F, uint64_t seed, DType rounded_dt = DType::f32, DType inp_dt = DType::f32) {
  auto inp = randn(N * 2 * F, seed, 2.0), dout = randn(N * F, seed + 1);
  const bool rounds = rounded_dt != DType::f32;
  std::vector<Operand> ops = {inp_dt == DType::f32 ? f32("inp", inp) : param("inp", inp, inp_dt), fill("out", N * F, 9),
                              f32("dout", dout), fill("dinp", N * 2 * F, 3.0f)};
  if (rounds) ops.push_back(fill16("out16", N * F, rounded_dt)), ops.push_back(fill16("dinp16", N * 2 * F, rounded_dt));
  add({named("swiglu_N", N) + named("_F", F) + (rounds ? std::string("_") + dtype_tag(rounded_dt) : "") +
           (inp_dt == DType::f32 ? "" : std::string("_from_") + dtype_tag(inp_dt)),
       ops,
       [=](Backend& b, const Dev& d) {
         b.swiglu_forward(d.f("out"), DType::f32, d.v("inp"), inp_dt, N, F);
         b.swiglu_backward(d.f("dinp"), DType::f32, d.f("dout"), d.v("inp"), inp_dt, N, F);
         if (rounds) {
           b.swiglu_forward(d.v("out16"), rounded_dt, d.v("inp"), inp_dt, N, F);
           b.swiglu_backward(d.v("dinp16"), rounded_dt, d.f("dout"), d.v("inp"), inp_dt, N, F);
         }
         return std::vector<double>{};
       },
       [=] {
         const Vec X = seen(inp, inp_dt);
         auto f = [&](const Vec& x) { return ref::swiglu(x, N, F); };
         return std::vector<Want>{close("out", f(X)), close("dinp", numeric_grad(X, f, to_double(dout)))};
       },
       [=](const Result& r) {
         if (!rounds) return;
         expect_rounded_copy(r, "out", "out16");
         expect_rounded_copy(r, "dinp", "dinp16");
       }});
}

// `rounded_dt` and `inp_dt` as swiglu_case's.
void gelu_case(size_t n, uint64_t seed, DType rounded_dt = DType::f32, DType inp_dt = DType::f32) {
  auto inp = randn(n, seed, 2.0), dout = randn(n, seed + 1);
  const bool rounds = rounded_dt != DType::f32;
  std::vector<Operand> ops = {inp_dt == DType::f32 ? f32("inp", inp) : param("inp", inp, inp_dt), fill("out", n, 9),
                              f32("dout", dout), fill("dinp", n, 3.0f), f32("dinout", dout)};
  if (rounds) ops.push_back(fill16("out16", n, rounded_dt));
  add({named("gelu_n", n) + (rounds ? std::string("_") + dtype_tag(rounded_dt) : "") +
           (inp_dt == DType::f32 ? "" : std::string("_from_") + dtype_tag(inp_dt)),
       ops,
       [=](Backend& b, const Dev& d) {
         b.gelu_forward(d.f("out"), DType::f32, d.v("inp"), inp_dt, n);
         if (rounds) b.gelu_forward(d.v("out16"), rounded_dt, d.v("inp"), inp_dt, n);
         b.gelu_backward(d.f("dinp"), d.v("inp"), inp_dt, d.f("dout"), n);
         b.gelu_backward(d.f("dinout"), d.v("inp"), inp_dt, d.f("dinout"), n);  // dinp may alias dout
         return std::vector<double>{};
       },
       [=] {
         const Vec X = seen(inp, inp_dt);
         const Vec g = numeric_grad(X, ref::gelu, to_double(dout));
         return std::vector<Want>{close("out", ref::gelu(X)), close("dinp", g), close("dinout", g)};
       },
       [=](const Result& r) {
         if (rounds) expect_rounded_copy(r, "out", "out16");
       }});
}

void residual_case(size_t n, uint64_t seed) {
  auto a = randn(n, seed), b = randn(n, seed + 1);
  add({named("residual_n", n),
       {f32("a", a), f32("b", b), fill("out", n, 9)},
       [=](Backend& be, const Dev& d) {
         be.residual_forward(d.f("out"), d.f("a"), d.f("b"), n);
         return std::vector<double>{};
       },
       [=] {
         Vec want(n);
         for (size_t i = 0; i < n; ++i) want[i] = static_cast<float>(static_cast<double>(a[i]) + b[i]);  // one f32 add
         return std::vector<Want>{exact("out", want)};
       }});
}

// Cross-entropy over the first V of Vp columns; the padded columns hold large logits that must
// not count, and their gradient is exactly 0.
// `rounded_dt` as swiglu_case's (dlogits16: a separate buffer; f32 may be written in place).
// `in_place`: the gradient written over the logits (an f32 GPT-2 run's form), then read from there.
// A cross-entropy case's inputs: logits (N, Vp) with 100 in the padded columns, and targets of
// which the first is the last real column.
struct CrossentropyInputs {
  std::vector<float> logits;
  std::vector<int32_t> targets;
};
CrossentropyInputs crossentropy_inputs(int N, int V, int Vp, uint64_t seed) {
  CrossentropyInputs in{randn(N * Vp, seed, 3.0), std::vector<int32_t>(N)};
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) in.logits[n * Vp + v] = 100.0f;
  Rng rng(seed + 1);
  for (auto& t : in.targets) t = static_cast<int32_t>(rng.below(V));
  in.targets[0] = V - 1;
  return in;
}

void crossentropy_case(int N, int V, int Vp, float dloss, uint64_t seed, DType rounded_dt = DType::f32,
                       bool in_place = false) {
  const auto [logits, targets] = crossentropy_inputs(N, V, Vp, seed);
  const bool rounds = rounded_dt != DType::f32;
  ZERONE_ASSERT(!(rounds && in_place), "a 16-bit gradient is never written over the logits");
  std::vector<Operand> ops = {f32("logits", logits), i32("targets", targets), fill("losses", N, 9), fill("lse", N, 9),
                              in_place ? f32("dlogits", logits) : fill("dlogits", N * Vp, 9)};
  if (rounds) ops.push_back(fill16("dlogits16", N * Vp, rounded_dt));
  add({named("crossentropy_N", N) + named("_V", V) + named("_Vp", Vp) +
           (rounds ? std::string("_") + dtype_tag(rounded_dt) : "") + (in_place ? "_in_place" : ""),
       ops,
       [=](Backend& b, const Dev& d) {
         float* logits_at = in_place ? d.f("dlogits") : d.f("logits");  // in place: dlogits holds the logits
         b.crossentropy_forward(d.f("losses"), d.f("lse"), logits_at, DType::f32, d.i("targets"), N, V, Vp);
         b.crossentropy_backward(d.f("dlogits"), DType::f32, logits_at, DType::f32, d.f("lse"), d.i("targets"), dloss, N,
                                 V, Vp);
         if (rounds)
           b.crossentropy_backward(d.v("dlogits16"), rounded_dt, d.f("logits"), DType::f32, d.f("lse"), d.i("targets"),
                                   dloss, N, V, Vp);
         return std::vector<double>{};
       },
       [=] {
         const Vec L = to_double(logits);
         auto f = [&](const Vec& l) { return ref::crossentropy(l, targets, N, V, Vp); };
         return std::vector<Want>{close("losses", f(L), 1e-5), close("lse", ref::logsumexp(L, N, V, Vp), 1e-5),
                                  close("dlogits", numeric_grad(L, f, constant(N, dloss)))};
       },
       [=](const Result& r) {
         const Vec g = r.values("dlogits");
         for (int n = 0; n < N; ++n)
           for (int v = V; v < Vp; ++v) EXPECT_EQ(g[n * Vp + v], 0.0) << "padded column " << v << " of row " << n;
         if (rounds) expect_rounded_copy(r, "dlogits", "dlogits16");
       }});
}

// Note [Logits in the compute dtype]: logits stored in 16 bits (what a 16-bit model's head writes),
// read widened by the forward, and the gradient written over them in the same dtype. The reference
// takes the rounded logits; dlogits is held to the 16-bit rounding (relative 2^-9 for bf16).
void crossentropy_16bit_logits_case(int N, int V, int Vp, float dloss, uint64_t seed, DType dt) {
  const auto [logits, targets] = crossentropy_inputs(N, V, Vp, seed);
  add({named("crossentropy_logits16_N", N) + named("_V", V) + named("_Vp", Vp) + "_" + dtype_tag(dt),
       {param("logits", logits, dt), i32("targets", targets), fill("losses", N, 9), fill("lse", N, 9)},
       [=](Backend& b, const Dev& d) {
         b.crossentropy_forward(d.f("losses"), d.f("lse"), d.v("logits"), dt, d.i("targets"), N, V, Vp);
         b.crossentropy_backward(d.v("logits"), dt, d.v("logits"), dt, d.f("lse"), d.i("targets"), dloss, N, V, Vp);
         return std::vector<double>{};
       },
       [=] {
         const Vec L = seen(logits, dt);
         auto f = [&](const Vec& l) { return ref::crossentropy(l, targets, N, V, Vp); };
         return std::vector<Want>{close("losses", f(L), 1e-5), close("lse", ref::logsumexp(L, N, V, Vp), 1e-5),
                                  close("logits", numeric_grad(L, f, constant(N, dloss)), 4e-3)};
       },
       [=](const Result& r) {
         const Vec g = r.values("logits");
         for (int n = 0; n < N; ++n)
           for (int v = V; v < Vp; ++v) EXPECT_EQ(g[n * Vp + v], 0.0) << "padded column " << v << " of row " << n;
       }});
}

void transformer_cases() {
  embedding_case(2, 3, 4, 5, DType::f32, true, 15);
  embedding_case(1, 1, 7, 3, DType::bf16, false, 16);  // T = 1, LLaMA (no position table)
  embedding_case(2, 5, 3, 7, DType::f16, true, 17);
  embedding_case(3, 2, 5, 4, DType::bf16, true, 18);
  layernorm_case(5, 12, DType::f32, 7);
  layernorm_case(3, 7, DType::bf16, 20);
  layernorm_case(1, 13, DType::f16, 21);
  layernorm_case(4, 768, DType::bf16, 22);  // GPT-2's width: the vector loops
  layernorm_case(19, 768, DType::bf16, 23);  // Note [Norms a warp per row]: 3 blocks of 8 rows, the last partial
  layernorm_case(9, 100, DType::f32, 24);    // lanes making 3 or 4 passes of a row
  // Note [Column sums in two passes] (cuda): 3 blocks of 64 rows (the last of 2), 2 of 128 columns
  // (the last of 4).
  layernorm_case(130, 132, DType::bf16, 25);
  rmsnorm_case(70, 132, DType::f32, 64);
  rmsnorm_case(5, 12, DType::f32, 60);
  rmsnorm_case(5, 12, DType::bf16, 61);
  rmsnorm_case(1, 9, DType::f16, 62);
  rmsnorm_case(19, 2048, DType::bf16, 63);  // LLaMA-1B's width, blocks of 8 rows (Note [Norms a warp per row])
  linear_case(6, 5, 7, DType::f32, true, true, true, 1);
  linear_case(1, 3, 1, DType::f32, false, false, true, 22);
  linear_case(7, 9, 5, DType::f32, true, false, false, 23);  // the first layer: no input gradient
  linear_case(8, 16, 12, DType::bf16, false, true, true, 5, 1e-5);
  linear_case(5, 7, 9, DType::bf16, true, false, true, 24);
  linear_case(6, 5, 7, DType::f16, true, true, true, 25);
  linear_case(3, 11, 4, DType::f16, false, false, true, 26);
  // The bias's column sums in two passes (cuda: 3 row blocks, 3 column blocks) and, in bf16 and
  // f16, the GEMMs' operand rounded on the way (Note [Rounded on the way]).
  linear_case(130, 4, 260, DType::bf16, true, true, true, 27);
  linear_case(130, 4, 260, DType::f16, true, false, true, 28);
  linear_case(130, 4, 260, DType::f32, true, false, true, 29);
  linear_bf16_columns_case();
  // GPT-2's fc backward (Note [GELU's backward in the linear's]): the fused column sums on cuda
  // (whole 16-byte rows, 3 row blocks), their fallback (OC = 9), f32 (no fusion).
  linear_through_gelu_case(130, 8, 260, DType::bf16, true, true, 30);
  linear_through_gelu_case(130, 8, 260, DType::f16, false, true, 31);
  linear_through_gelu_case(70, 16, 64, DType::bf16, false, false, 32);
  linear_through_gelu_case(5, 7, 9, DType::bf16, true, true, 33);
  linear_through_gelu_case(6, 5, 12, DType::f32, true, true, 34);
  linear_rounded_operands_case(8, 16, 12, DType::bf16, false, 90);
  linear_rounded_operands_case(5, 7, 9, DType::bf16, true, 91);
  linear_rounded_operands_case(6, 5, 7, DType::f16, false, 92);
  linear_rounded_operands_case(3, 11, 4, DType::f16, true, 93);
  linear_rounded_operands_case(64, 768, 96, DType::bf16, false, 94);  // GPT-2's width, AMX tiles
  // Aligned rows with a bias: a 16-bit output through cuBLASLt's bias epilogue (GPT-2's qkv, Note
  // [Attention's inputs and output in the compute dtype]).
  linear_rounded_operands_case(64, 768, 96, DType::bf16, true, 95);
  linear_rounded_operands_case(32, 64, 48, DType::f16, true, 96);
  attention_case(2, 5, 2, 0, 4, 11);
  attention_case(1, 1, 2, 0, 3, 27);  // T = 1, odd head size
  attention_case(3, 7, 3, 0, 3, 28);
  for (int NKV : {2, 1, 4}) attention_case(2, 5, 4, NKV, 4, 40 + NKV);  // groups of 2, multi-query, multi-head
  attention_case(1, 1, 4, 2, 3, 29);
  attention_case(2, 3, 6, 2, 5, 30);  // groups of 3, odd head size
  // Note [Flash attention rows]
  attention_case(2, 33, 4, 2, 64, 31);  // one past a lane tile, groups of 2, hs 64
  attention_case(1, 70, 2, 0, 64, 32);  // GPT-2: three warp tiles, the last partial
  attention_case(1, 37, 4, 1, 128, 33);  // multi-query, hs 128
  attention_case(1, 40, 3, 1, 33, 34);  // groups of 3, odd hs 33 (a second chunk of one channel)
  attention_case(1, 35, 2, 0, 255, 35);  // hs 255: eight chunks, warp tiles of 16
  attention_case(1, 17, 2, 2, 256, 36);  // the largest head size flash takes
  // Note [Flash attention on tensor cores]: its head sizes, T one short of, at and past its 64-row
  // tiles, GQA groups of 2 and 3, both 16-bit dtypes; hs 48 is not built for (the f32 form runs).
  attention_case(2, 70, 2, 0, 64, 37, DType::bf16);     // GPT-2's head size, a partial second tile
  attention_case(1, 64, 4, 2, 64, 38, DType::f16);      // exactly one tile, groups of 2
  attention_case(1, 129, 6, 2, 128, 39, DType::bf16);   // LLaMA-7B's head size, groups of 3
  attention_case(2, 63, 2, 1, 32, 40, DType::f16);      // multi-query, one short of a tile
  attention_case(1, 100, 2, 0, 16, 41, DType::bf16);    // the smallest head size it takes
  attention_case(1, 65, 3, 3, 96, 42, DType::bf16);     // one past a tile
  attention_case(1, 20, 2, 0, 48, 43, DType::bf16);     // not built for: the f32 form
  // Five tiles, the last partial: each of Note [Tiles loaded ahead]'s two buffers refilled twice.
  attention_case(1, 300, 4, 2, 64, 45, DType::bf16);
  // Note [Query rows a warp owns], Note [Key rows a warp owns]: two whole 128-row blocks and one row
  // past them (its block's first warp alive alone), LLaMA-1B's groups of 4; f16 at hs 32 over 2.5 blocks.
  attention_case(1, 257, 8, 2, 64, 46, DType::bf16);
  attention_case(2, 160, 4, 4, 32, 47, DType::f16);
  rope_case(2, 6, 3, 4, 8, false, 70);  // NH 2 query, NKV 1 key, 1 value head: the values stay
  rope_case(2, 6, 3, 4, 8, true, 71);
  rope_case(1, 1, 2, 2, 4, false, 72);  // T = 1: the identity
  rope_case(3, 5, 6, 8, 6, true, 73);
  rope_case(2, 6, 3, 4, 8, true, 74, DType::bf16);
  rope_case(1, 3, 4, 6, 4, false, 75, DType::f16);
  swiglu_case(4, 6, 80);
  swiglu_case(1, 1, 81);
  swiglu_case(3, 7, 82);
  swiglu_case(3, 7, 83, DType::bf16);
  swiglu_case(2, 37, 84, DType::f16);
  gelu_case(40, 13);
  gelu_case(1, 14);
  gelu_case(333, 15);
  gelu_case(9001, 16, DType::bf16);  // past one block of the cpu kernel, a partial last one
  gelu_case(333, 17, DType::f16);
  gelu_case(9000, 18, DType::bf16);  // a multiple of 4: the GPU's four-at-a-time forms
  gelu_case(1000, 19, DType::f16);
  // A 16-bit run's input (Note [The MLP's hidden activation in the compute dtype]): odd sizes take
  // the one-at-a-time forms, multiples of 4 the GPU's four-at-a-time ones.
  swiglu_case(3, 7, 85, DType::bf16, DType::bf16);
  swiglu_case(2, 37, 86, DType::f16, DType::f16);
  gelu_case(9001, 20, DType::bf16, DType::bf16);
  gelu_case(1000, 21, DType::bf16, DType::bf16);
  gelu_case(1000, 22, DType::f16, DType::f16);
  gelu_case(333, 23, DType::f32, DType::bf16);
  residual_case(37, 31);
  residual_case(20001, 32);
  residual_case(20000, 33);  // a multiple of 4: the GPU's four-at-a-time form
  crossentropy_case(4, 6, 8, 0.3f, 18);
  crossentropy_case(1, 5, 8, 1.0f, 19);
  crossentropy_case(3, 11, 16, 0.125f, 33);
  crossentropy_case(3, 11, 16, 0.125f, 34, DType::bf16);
  crossentropy_case(2, 50, 64, 1.0f, 35, DType::f16);
  crossentropy_case(3, 5, 7, 0.5f, 36);  // Vp not a multiple of 4: the GPU's element-at-a-time backward
  crossentropy_case(2, 9, 10, 0.25f, 37, DType::bf16);
  // Rows longer than a block's float4 step (the GPU's loops go round), V one past a multiple of 4,
  // and in place as an f32 GPT-2 run writes it.
  crossentropy_case(3, 2051, 2064, 0.5f, 38, DType::bf16);
  crossentropy_case(3, 2051, 2064, 0.5f, 39, DType::f32, true);
  crossentropy_case(2, 6, 8, 1.0f, 40, DType::f32, true);
  crossentropy_16bit_logits_case(3, 11, 16, 0.125f, 41, DType::bf16);
  crossentropy_16bit_logits_case(2, 50, 64, 1.0f, 42, DType::f16);
  crossentropy_16bit_logits_case(3, 5, 7, 0.5f, 43, DType::bf16);  // Vp not a multiple of 4: element at a time
  crossentropy_16bit_logits_case(3, 2051, 2064, 0.5f, 44, DType::bf16);
}

// --- the image classifiers

void relu_case(size_t n, uint64_t seed) {
  auto inp = randn(n, seed), dout = randn(n, seed + 1);
  for (float& x : inp)
    if (std::abs(x) < 1e-3f) x = 0.5f;  // away from the kink, where differences are undefined
  add({named("relu_n", n),
       {f32("inp", inp), fill("out", n, 9), f32("dout", dout), fill("dinp", n, 3)},
       [=](Backend& b, const Dev& d) {
         b.relu_forward(d.f("out"), d.f("inp"), n);
         b.relu_backward(d.f("dinp"), d.f("dout"), d.f("out"), n);
         return std::vector<double>{};
       },
       [=] {
         const Vec X = to_double(inp);
         return std::vector<Want>{exact("out", ref::relu(X)), close("dinp", numeric_grad(X, ref::relu, to_double(dout)))};
       }});
}

// Note [Dropout keys]: element e of sample s is kept iff uniform(seed, mix(key, first_sample + s), e) >= p.
std::vector<int> dropout_keep(int N, size_t per, float p, const DropoutKey& key) {
  std::vector<int> keep(N * per);
  for (int s = 0; s < N; ++s) {
    const uint64_t stream = mix64(key.key ^ mix64(key.first_sample + static_cast<uint64_t>(s)));
    for (size_t e = 0; e < per; ++e) keep[s * per + e] = uniform_at(key.seed, stream, e) >= static_cast<double>(p);
  }
  return keep;
}

void dropout_case(int N, size_t per, float p, DropoutKey key, uint64_t seed) {
  const size_t n = N * per;
  auto inp = randn(n, seed), dout = randn(n, seed + 1);
  add({named("dropout_N", N) + named("_per", per) + named("_p", int(p * 100)),
       {f32("inp", inp), fill("out", n, 9), f32("dout", dout), fill("dinp", n, 9), fill("split", n, 9),
        fill("other", n, 9)},
       [=](Backend& b, const Dev& d) {
         b.dropout_forward(d.f("out"), d.f("inp"), N, per, p, key);
         b.dropout_backward(d.f("dinp"), d.f("dout"), N, per, p, key);
         // The same samples split into two micro-batches (two ranks) get the same masks.
         const int first = N / 2;
         DropoutKey later = key;
         later.first_sample += first;
         b.dropout_forward(d.f("split"), d.f("inp"), first, per, p, key);
         b.dropout_forward(d.f("split") + first * per, d.f("inp") + first * per, N - first, per, p, later);
         DropoutKey next = key;  // another step draws another mask
         next.key += 1;
         b.dropout_forward(d.f("other"), d.f("inp"), N, per, p, next);
         return std::vector<double>{};
       },
       [=] {
         const std::vector<int> keep = dropout_keep(N, per, p, key);
         const Vec X = to_double(inp);
         auto f = [&](const Vec& x) { return ref::dropout(x, keep, p); };
         return std::vector<Want>{close("out", f(X)), close("split", f(X)),
                                  close("dinp", numeric_grad(X, f, to_double(dout)))};
       },
       [=](const Result& r) {
         EXPECT_EQ(r.values("split"), r.values("out"));
         if (p > 0 && n >= 50) {
           EXPECT_NE(r.values("other"), r.values("out"));
         }
         size_t kept = 0;
         for (double x : r.values("out")) kept += x != 0.0;
         if (n >= 100) {
           EXPECT_GT(kept, n * (1 - p) * 0.8);
           EXPECT_LT(kept, n * (1 - p) * 1.2);
         }
       }});
}

void softmax_ce_case(int N, int K, float scale, uint64_t seed) {
  auto logits = randn(N * K, seed, 3.0);
  std::vector<int32_t> labels(N);
  Rng rng(seed + 1);
  for (auto& l : labels) l = static_cast<int32_t>(rng.below(K));
  labels[0] = K - 1;
  add({named("softmax_cross_entropy_N", N) + named("_K", K),
       {f32("logits", logits), i32("labels", labels), fill("probs", N * K, 9), fill("losses", N, 9),
        fill("dlogits", N * K, 9), fill("dinplace", N * K, 9)},
       [=](Backend& b, const Dev& d) {
         int64_t correct = -1;
         const float loss = b.softmax_cross_entropy_forward(d.f("probs"), d.f("losses"), d.f("logits"), d.i("labels"),
                                                            N, K, &correct);
         const float loss2 = b.softmax_cross_entropy_forward(d.f("dinplace"), d.f("losses"), d.f("logits"),
                                                             d.i("labels"), N, K);
         b.softmax_cross_entropy_backward(d.f("dlogits"), d.f("probs"), d.i("labels"), N, K, scale);
         b.softmax_cross_entropy_backward(d.f("dinplace"), d.f("dinplace"), d.i("labels"), N, K, scale);  // may alias
         return std::vector<double>{loss, double(correct), loss2};
       },
       [=] {
         const Vec X = to_double(logits);
         const double want = ref::softmax_cross_entropy(X, labels, N, K);
         int64_t hits = 0;
         Vec losses(N);
         for (int n = 0; n < N; ++n) {
           hits += std::max_element(logits.begin() + n * K, logits.begin() + (n + 1) * K) - (logits.begin() + n * K) ==
                   labels[n];
           losses[n] = ref::softmax_cross_entropy(Vec(X.begin() + n * K, X.begin() + (n + 1) * K), {labels[n]}, 1, K);
         }
         const Vec g = numeric_grad(X, [&](const Vec& x) { return Vec{ref::softmax_cross_entropy(x, labels, N, K)}; },
                                    Vec{scale});
         return std::vector<Want>{close("#0", {want}, 1e-5), exact("#1", {double(hits)}), close("#2", {want}, 1e-5),
                                  close("probs", ref::softmax(X, N, K)), close("losses", losses, 1e-5),
                                  close("dlogits", g), close("dinplace", g)};
       }});
}

struct ConvShape {
  int N, C, H, W, OC, KH, KW, sh, sw, ph, pw;
};
std::string conv_tag(const ConvShape& k) {
  return named("N", k.N) + named("_C", k.C) + named("_", k.H) + "x" +
         std::to_string(k.W) + named("_OC", k.OC) + named("_k", k.KH) + named("x", k.KW) +
         named("_s", k.sh) + named("x", k.sw) + named("_p", k.ph) + "x" +
         std::to_string(k.pw);
}

// Values of (N, C, H, W) held in `layout` (block: the channel block of ActLayout::blocked).
Vec in_layout(const Vec& plain, ActLayout layout, int N, int C, int H, int W, int block) {
  return layout == ActLayout::blocked ? ref::to_blocked(plain, N, C, H, W, block) : plain;
}
std::vector<float> in_layout(const std::vector<float>& plain, ActLayout layout, int N, int C, int H, int W, int block) {
  const Vec v = in_layout(to_double(plain), layout, N, C, H, W, block);
  return std::vector<float>(v.begin(), v.end());
}
const char* layout_tag(ActLayout l) { return l == ActLayout::blocked ? "blocked" : "plain"; }

// Conv2d forward, then backward twice: accumulating (onto 0.5 / 0.25, with the input gradient)
// and overwriting (fresh gradients over garbage, without the input gradient). Activations and
// their gradients in src/dst layouts; blocked ones are compared with the reference laid out
// blocked, and their padding channels must hold exact zeros.
void conv_case(const ConvShape& k, bool with_bias, ActLayout src, ActLayout dst, int block, uint64_t seed) {
  Conv2dShape s{k.N, k.C, k.H, k.W, k.OC, k.KH, k.KW, k.sh, k.sw, k.ph, k.pw, src, dst};
  const int OH = s.OH(), OW = s.OW();
  const size_t in_n = static_cast<size_t>(k.N) * k.C * k.H * k.W, w_n = static_cast<size_t>(k.OC) * k.C * k.KH * k.KW;
  const size_t out_n = static_cast<size_t>(k.N) * k.OC * OH * OW;
  auto inp = randn(in_n, seed), w = randn(w_n, seed + 1), bias = randn(k.OC, seed + 2), dout = randn(out_n, seed + 3);
  const auto x_l = in_layout(inp, src, k.N, k.C, k.H, k.W, block), dout_l = in_layout(dout, dst, k.N, k.OC, OH, OW, block);
  std::string name = "conv2d_" + conv_tag(k) + (with_bias ? "" : "_nobias");
  if (src != ActLayout::plain || dst != ActLayout::plain) name += std::string("_") + layout_tag(src) + "_to_" + layout_tag(dst);
  const bool any_blocked = src == ActLayout::blocked || dst == ActLayout::blocked;
  std::vector<Operand> ops = {f32("inp", x_l), f32("weight", w), f32("bias", bias), fill("out", dout_l.size(), 9),
                              f32("dout", dout_l), fill("dinp", x_l.size(), 9), fill("dweight", w_n, 0.5f),
                              fill("dbias", k.OC, 0.25f), fill("dweight_fresh", w_n, 1e30f),
                              fill("dbias_fresh", k.OC, 1e30f)};
  if (any_blocked) {  // the same in plain layouts: Note [Conv layouts] promises the same bits
    for (Operand o : {f32("inp", inp), fill("out", out_n, 9), f32("dout", dout), fill("dinp", in_n, 9),
                      fill("dweight", w_n, 0.5f), fill("dbias", k.OC, 0.25f)})
      ops.push_back((o.name += "_plain", o));
  }
  add({name, ops,
       [=](Backend& b, const Dev& d) {
         const float* bp = with_bias ? d.f("bias") : nullptr;
         b.conv2d_forward(d.f("out"), d.f("inp"), d.f("weight"), bp, s);
         b.conv2d_backward(d.f("dinp"), d.f("dweight"), with_bias ? d.f("dbias") : nullptr, d.f("dout"), d.f("inp"),
                           d.f("weight"), s, true);
         b.conv2d_backward(nullptr, d.f("dweight_fresh"), with_bias ? d.f("dbias_fresh") : nullptr, d.f("dout"),
                           d.f("inp"), d.f("weight"), s, false);
         if (any_blocked) {
           Conv2dShape plain = s;
           plain.src_layout = plain.dst_layout = ActLayout::plain;
           b.conv2d_forward(d.f("out_plain"), d.f("inp_plain"), d.f("weight"), bp, plain);
           b.conv2d_backward(d.f("dinp_plain"), d.f("dweight_plain"), with_bias ? d.f("dbias_plain") : nullptr,
                             d.f("dout_plain"), d.f("inp_plain"), d.f("weight"), plain, true);
         }
         return std::vector<double>{};
       },
       [=] {
         const Vec X = to_double(inp), W = to_double(w), Bv = with_bias ? to_double(bias) : Vec{}, D = to_double(dout);
         auto f = [&](const Vec& x, const Vec& ww, const Vec& bb) {
           return ref::conv2d(x, ww, bb, k.N, k.C, k.H, k.W, k.OC, k.KH, k.KW, k.sh, k.sw, k.ph, k.pw);
         };
         const Vec gw = numeric_grad(W, [&](const Vec& ww) { return f(X, ww, Bv); }, D);
         std::vector<Want> want = {
             close("out", in_layout(f(X, W, Bv), dst, k.N, k.OC, OH, OW, block)),
             close("dinp", in_layout(numeric_grad(X, [&](const Vec& x) { return f(x, W, Bv); }, D), src, k.N, k.C, k.H,
                                     k.W, block)),
             close("dweight", plus(gw, 0.5)), close("dweight_fresh", gw)};
         if (with_bias) {
           const Vec gb = numeric_grad(Bv, [&](const Vec& bb) { return f(X, W, bb); }, D);
           want.push_back(close("dbias", plus(gb, 0.25)));
           want.push_back(close("dbias_fresh", gb));
         } else {
           want.push_back(exact("dbias", constant(k.OC, 0.25)));
           want.push_back(exact("dbias_fresh", constant(k.OC, 1e30f)));
         }
         return want;
       },
       [=](const Result& r) {
         // Blocked tensors keep exact zeros in their padding channels.
         auto zero_padding = [&](const char* what, int C, int H, int W) {
           const Vec v = r.values(what), back = ref::to_blocked(ref::to_plain(v, k.N, C, H, W, block), k.N, C, H, W, block);
           size_t bad = 0;
           for (size_t i = 0; i < v.size(); ++i) bad += back[i] == 0.0 && v[i] != 0.0;
           EXPECT_EQ(bad, 0u) << what << ": nonzero padding channels";
         };
         if (dst == ActLayout::blocked) zero_padding("out", k.OC, OH, OW);
         if (src == ActLayout::blocked) zero_padding("dinp", k.C, k.H, k.W);
         if (!any_blocked) return;
         // Holding activations blocked changes no value: the plain run's bits.
         auto plain_of = [&](const char* what, ActLayout l, int C, int H, int W) {
           return l == ActLayout::blocked ? ref::to_plain(r.values(what), k.N, C, H, W, block) : r.values(what);
         };
         check(r, exact("out_plain", plain_of("out", dst, k.OC, OH, OW)));
         check(r, exact("dinp_plain", plain_of("dinp", src, k.C, k.H, k.W)));
         check(r, exact("dweight_plain", r.values("dweight")));
         check(r, exact("dbias_plain", r.values("dbias")));
       },
       any_blocked ? block : 0});
}

// The workspace of `s` on every backend the case runs on (oneDNN's depends on the CPU: on an AVX2
// one it is smaller than the GPU's).
size_t maxpool_workspace_bytes(const Pool2dShape& s) {
  size_t bytes = 0;
  for (DeviceKind kind : available_devices()) bytes = std::max(bytes, backend(kind).maxpool2d_workspace_bytes(s));
  return bytes;
}

// Max pooling; distinct inputs (a shuffled ramp) so that no window has a tie and differences are smooth.
void maxpool_case(int N, int C, int H, int W, int KH, int KW, int sh, int sw, int ph, int pw, ActLayout layout,
                  int block, uint64_t seed) {
  Pool2dShape s{N, C, H, W, KH, KW, sh, sw, ph, pw, layout};
  const int OH = s.OH(), OW = s.OW();
  const size_t in_n = static_cast<size_t>(N) * C * H * W, out_n = static_cast<size_t>(N) * C * OH * OW;
  std::vector<float> inp(in_n);
  Rng rng(seed);
  for (size_t i = 0; i < in_n; ++i) inp[i] = static_cast<float>(i) * 0.01f;
  for (size_t i = in_n - 1; i > 0; --i) std::swap(inp[i], inp[rng.below(i + 1)]);
  auto dout = randn(out_n, seed + 1);
  const auto x_l = in_layout(inp, layout, N, C, H, W, block), dout_l = in_layout(dout, layout, N, C, OH, OW, block);
  const size_t ws = maxpool_workspace_bytes(s);
  Pool2dShape plain = s;
  plain.layout = ActLayout::plain;
  const size_t ws_plain = maxpool_workspace_bytes(plain);
  const bool blocked = layout == ActLayout::blocked;
  std::vector<Operand> ops = {f32("inp", x_l), fill("out", dout_l.size(), 9), opaque("workspace", ws),
                              f32("dout", dout_l), fill("dinp", x_l.size(), 7.0f)};
  if (blocked) {  // the same in plain layouts: Note [Conv layouts] promises the same bits
    for (Operand o : {f32("inp", inp), fill("out", out_n, 9), opaque("workspace", ws_plain), f32("dout", dout),
                      fill("dinp", in_n, 7.0f)})
      ops.push_back((o.name += "_plain", o));
  }
  add({named("maxpool2d_N", N) + named("_C", C) + named("_", H) + named("x", W) + named("_k", KH) + named("x", KW) +
           named("_s", sh) + named("x", sw) + named("_p", ph) + named("x", pw) + "_" + layout_tag(layout),
       ops,
       [=](Backend& b, const Dev& d) {
         ZERONE_CHECK(b.maxpool2d_workspace_bytes(s) <= ws, "workspace");
         b.maxpool2d_forward(d.f("out"), d.v("workspace"), d.f("inp"), s);
         b.maxpool2d_backward(d.f("dinp"), d.f("dout"), d.v("workspace"), s);
         if (blocked) {
           ZERONE_CHECK(b.maxpool2d_workspace_bytes(plain) <= ws_plain, "workspace");
           b.maxpool2d_forward(d.f("out_plain"), d.v("workspace_plain"), d.f("inp_plain"), plain);
           b.maxpool2d_backward(d.f("dinp_plain"), d.f("dout_plain"), d.v("workspace_plain"), plain);
         }
         return std::vector<double>{};
       },
       [=] {
         auto f = [&](const Vec& x) { return ref::maxpool2d(x, N, C, H, W, KH, KW, sh, sw, ph, pw); };
         const Vec X = to_double(inp);
         return std::vector<Want>{exact("out", in_layout(f(X), layout, N, C, OH, OW, block)),
                                  close("dinp", in_layout(numeric_grad(X, f, to_double(dout)), layout, N, C, H, W, block))};
       },
       [=](const Result& r) {
         if (!blocked) return;
         check(r, exact("out_plain", ref::to_plain(r.values("out"), N, C, OH, OW, block)));
         check(r, exact("dinp_plain", ref::to_plain(r.values("dinp"), N, C, H, W, block)));
         // The input gradient's padding channels are exactly 0 (the output's: "out" above).
         const Vec v = r.values("dinp"), back = ref::to_blocked(ref::to_plain(v, N, C, H, W, block), N, C, H, W, block);
         size_t bad = 0;
         for (size_t i = 0; i < v.size(); ++i) bad += back[i] == 0.0 && v[i] != 0.0;
         EXPECT_EQ(bad, 0u) << "dinp: nonzero padding channels";
       },
       blocked ? block : 0});
}

// Layout conversions, both ways, against the reference's nChw<block>c (padding channels zero).
void layout_case(int N, int C, int H, int W, int block, uint64_t seed) {
  auto x = randn(static_cast<size_t>(N) * C * H * W, seed);
  const Vec blocked = ref::to_blocked(to_double(x), N, C, H, W, block);
  add({named("activation_layouts_N", N) + named("_C", C) + named("_", H) + "x" +
           std::to_string(W),
       {f32("plain", x), fill("blocked", blocked.size(), 9), fill("back", x.size(), 9)},
       [=](Backend& b, const Dev& d) {
         b.activation_to_blocked(d.f("blocked"), d.f("plain"), N, C, H, W);
         b.activation_to_plain(d.f("back"), d.f("blocked"), N, C, H, W);
         return std::vector<double>{static_cast<double>(b.activation_numel(C, H, W, ActLayout::blocked)),
                                    static_cast<double>(b.activation_numel(C, H, W, ActLayout::plain))};
       },
       [=] {
         return std::vector<Want>{exact("blocked", blocked), exact("back", to_double(x)),
                                  exact("#0", {double(blocked.size() / N)}), exact("#1", {double(C * H * W)})};
       },
       {}, block});
}

void classifier_cases() {
  relu_case(40, 46);
  relu_case(7, 47);
  dropout_case(6, 50, 0.3f, DropoutKey{1337, 99, 12}, 48);
  dropout_case(1, 7, 0.5f, DropoutKey{7, 3, 0}, 49);
  dropout_case(3, 33, 0.0f, DropoutKey{1, 2, 3}, 50);  // p = 0 keeps everything
  softmax_ce_case(5, 7, 0.5f, 50);
  softmax_ce_case(1, 3, 1.0f, 51);
  softmax_ce_case(4, 10, 2.0f, 52);
  const ActLayout plain = ActLayout::plain, blocked = ActLayout::blocked;
  // Square and rectangular kernels, strides and padding (any kernel/stride/padding, issue 11).
  for (const ConvShape& k : {ConvShape{2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1}, ConvShape{1, 2, 9, 8, 3, 5, 5, 1, 1, 0, 0},
                             ConvShape{2, 2, 8, 9, 3, 3, 2, 2, 3, 1, 0}, ConvShape{1, 1, 6, 6, 2, 1, 1, 2, 2, 0, 0}})
    conv_case(k, true, plain, plain, 0, 40);
  conv_case(ConvShape{1, 3, 5, 4, 2, 3, 2, 1, 2, 1, 1}, false, plain, plain, 0, 41);
  maxpool_case(2, 3, 8, 8, 2, 2, 2, 2, 0, 0, plain, 0, 44);
  maxpool_case(1, 2, 7, 9, 3, 3, 2, 2, 1, 1, plain, 0, 45);
  maxpool_case(1, 2, 5, 6, 3, 2, 1, 2, 0, 1, plain, 0, 46);
  // Note [Conv layouts] (kernels/cpu/conv.cc): activations held in the channel-blocked layout, with
  // channel counts below, at and above one block and not multiples of it, every src/dst pairing.
  const int block = backend(DeviceKind::cpu).activation_channel_block();
  if (block == 0) return;  // oneDNN prefers plain layouts on this CPU: nothing is held blocked
  for (int C : {1, block, block + 3}) layout_case(2, C, 3, 2, block, 60 + C);
  const ConvShape shapes[] = {{2, 3, 5, 5, block + 1, 3, 3, 1, 1, 1, 1}, {1, block, 6, 5, 5, 3, 3, 2, 1, 1, 0},
                              {1, block + 8, 3, 3, 5, 3, 3, 1, 1, 1, 1}, {2, 1, 6, 6, block / 2 + 2, 5, 5, 1, 1, 0, 0}};
  for (const ConvShape& k : shapes)
    for (ActLayout src : {plain, blocked})
      for (ActLayout dst : {plain, blocked})
        if (src == blocked || dst == blocked) conv_case(k, true, src, dst, block, 70);
  maxpool_case(2, 3, 6, 6, 2, 2, 2, 2, 0, 0, blocked, block, 74);
  maxpool_case(1, block + 4, 5, 5, 3, 3, 2, 2, 1, 1, blocked, block, 75);
  maxpool_case(2, 2 * block, 4, 4, 2, 2, 2, 2, 0, 0, blocked, block, 76);
}

const std::vector<OpCase>& cases() {
  static const bool built = [] {
    engine_cases();
    optimizer_cases();
    transformer_cases();
    classifier_cases();
    return true;
  }();
  (void)built;
  return g_cases;
}

// ---------------------------------------------------------------- the tests

// One case on one backend; plain_attention: the cuda backend made with --cuda-attention plain
// (attention cases only: a GPU session bisects a flash failure with these rows).
struct OpParam {
  size_t index;
  DeviceKind kind;
  bool plain_attention = false;
  std::string name() const {
    return cases()[index].name + "_" + device_kind_name(kind) + (plain_attention ? "_plain" : "");
  }
  friend void PrintTo(const OpParam& p, std::ostream* os) { *os << p.name(); }
};
std::vector<OpParam> every_case_on_every_backend() {
  std::vector<OpParam> out;
  for (size_t i = 0; i < cases().size(); ++i) {
    for (DeviceKind kind : {DeviceKind::cpu, DeviceKind::sim, DeviceKind::cuda}) out.push_back({i, kind});
    if (cases()[i].logsumexp_reference) out.push_back({i, DeviceKind::cuda, true});
  }
  return out;
}

// The process's second cuda backend, with the plain attention kernels (throws Error as
// backend(cuda) does without a GPU). Never destroyed (Note [CUDA at exit], cuda_backend.cc).
Backend& plain_attention_backend() {
#ifdef ZERONE_HAVE_CUDA
  static Backend* plain = cuda::make_cuda_backend(DeviceOptions{.cuda_attention = CudaAttention::plain}).release();
  return *plain;
#else
  return backend(DeviceKind::cuda);  // throws: no CUDA backend in this build
#endif
}

class BackendOps : public ::testing::TestWithParam<OpParam> {};

TEST_P(BackendOps, MatchesReferenceAndCpu) {
  const auto [index, kind, plain_attention] = GetParam();
  const OpCase& c = cases()[index];
  Backend* b = nullptr;
  try {
    b = plain_attention ? &plain_attention_backend() : &backend(kind);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  if (c.block != 0 && b->activation_channel_block() != c.block)
    GTEST_SKIP() << device_kind_name(kind) << " holds blocked activations in blocks of "
                 << b->activation_channel_block() << ", this case's operands in blocks of " << c.block;
  const Result got = run_on(*b, c);
  // Note [Attention's saved state]: a backend saving the logsumexp is held to it instead.
  const bool saves_logsumexp = c.logsumexp_reference && b->attention_saved() == AttentionSaved::logsumexp;
  for (const Want& w : c.reference())
    if (!saves_logsumexp || w.what != "att") check(got, w);
  if (saves_logsumexp)
    for (const Want& w : c.logsumexp_reference()) check(got, w);
  if (c.extra) c.extra(got);
  if (kind == DeviceKind::cuda) {
    // Note [CUDA against the cpu backend]
    expect_close_to_cpu(got, run_on(backend(DeviceKind::cpu), c), saves_logsumexp ? "att" : "", c.f32_tolerance_to_cpu);
    expect_bitwise_equal(run_on(*b, c), got);                        // deterministic: the same bits again
  } else if (kind != DeviceKind::cpu) {
    expect_bitwise_equal(got, run_on(backend(DeviceKind::cpu), c));
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOps, ::testing::ValuesIn(every_case_on_every_backend()),
                         [](const ::testing::TestParamInfo<OpParam>& info) { return info.param.name(); });

// Note [Places of pointers]: a backend tells its device's memory from host memory; one whose
// device memory is host memory (cpu) says host for every pointer.
TEST(BackendPlaces, PlaceOfTellsDeviceFromHostMemory) {
  std::vector<float> host(16);
  for (DeviceKind kind : {DeviceKind::cpu, DeviceKind::sim, DeviceKind::cuda}) {
    SCOPED_TRACE(device_kind_name(kind));
    Backend* b = nullptr;
    try {
      b = &backend(kind);
    } catch (const Error&) {
      continue;  // not in this build or on this machine
    }
    Buffer dev(64, MemCategory::scratch, MemPlace::device, 64, b->device_arena());
    const MemPlace device_place = b->host_addressable() ? MemPlace::host : MemPlace::device;
    EXPECT_EQ(b->place_of(dev.data()), device_place);
    EXPECT_EQ(b->place_of(static_cast<char*>(dev.data()) + 63), device_place);
    EXPECT_EQ(b->place_of(host.data()), MemPlace::host);
  }
}

// Every Backend operation has a case (a new operation must bring its own).
TEST(BackendOps, TableCoversEveryOperation) {
  std::string names;
  for (const OpCase& c : cases()) names += c.name + " ";
  for (const char* op : {"copy_places", "fill_zero", "accumulate", "sum_squares", "convert_f32_bf16", "convert_f32_f16",
                         "all_finite", "adamw", "sgd", "embedding", "layernorm", "linear", "attention", "gqa_attention",
                         "rmsnorm", "rope", "swiglu", "gelu", "linear_through_gelu", "residual", "crossentropy", "relu", "dropout",
                         "softmax_cross_entropy", "conv2d", "maxpool2d"})
    EXPECT_NE(names.find(op), std::string::npos) << "no case for " << op;
  if (backend(DeviceKind::cpu).activation_channel_block() > 0) {
    for (const char* op : {"activation_layouts", "plain_to_blocked", "blocked_to_plain", "blocked_to_blocked", "_blocked "})
      EXPECT_NE(names.find(op), std::string::npos) << "no case for " << op;
  }
}

// The rotary frequency table against Hugging Face's rule. Llama-3.2-1B: head size 64, theta
// 500000, rope_scaling {factor 32, low 1, high 4, original 8192}; the shape exercises all three
// branches (kept, divided, blended).
TEST(RopeInvFreq, PlainAndLlama3Scaling) {
  const int hs = 64;
  std::vector<float> plain(hs / 2), scaled(hs / 2);
  rope_inv_freq(plain.data(), hs, 500000.0f);
  RopeScaling s;
  s.factor = 32.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position = 8192;
  rope_inv_freq(scaled.data(), hs, 500000.0f, s);
  const Vec want_plain = ref::rope_inv_freq(hs, 500000.0), want_scaled = ref::rope_inv_freq(hs, 500000.0, 32, 1, 4, 8192);
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < hs / 2; ++i) {
    EXPECT_NEAR(plain[i], want_plain[i], 1e-6 * want_plain[i]) << i;
    EXPECT_NEAR(scaled[i], want_scaled[i], 2e-6 * want_scaled[i]) << i;
    const double r = want_scaled[i] / want_plain[i];
    (r == 1 ? kept : std::abs(r - 1.0 / 32) < 1e-12 ? divided : blended)++;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

// Note [oneDNN 2.6 AMX column tails] with a bf16 output (Note [Logits in the compute dtype]): the
// f32 form an AMX CPU takes, forced here on any CPU and cut into bands of 8 rows (37 rows: 5
// bands, the last of 5), gives the direct bf16 output within one unit in the last place (the two
// forms may sum in other orders), for A plain and transposed.
TEST(MatmulBf16Out, TheBandedFallbackMatchesTheDirectForm) {
  const int64_t m = 37, n = 50, k = 24;
  const std::vector<float> a = randn(m * k, 501), b = randn(k * n, 502), bias = randn(n, 503);
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  convert_from_f32(a.data(), a16.data(), DType::bf16, a.size());
  convert_from_f32(b.data(), b16.data(), DType::bf16, b.size());
  for (bool trans_a : {false, true}) {
    SCOPED_TRACE(trans_a ? "A transposed" : "A plain");
    std::vector<uint16_t> direct(m * n), banded(m * n);
    cpu::matmul_bf16_out(a16.data(), trans_a, b16.data(), false, direct.data(), m, n, k, bias.data());
    cpu::force_amx_column_fallback_for_testing(true, sizeof(float) * n * 8);
    cpu::matmul_bf16_out(a16.data(), trans_a, b16.data(), false, banded.data(), m, n, k, bias.data());
    cpu::force_amx_column_fallback_for_testing(false);
    for (size_t i = 0; i < direct.size(); ++i)
      ASSERT_LE(std::abs(static_cast<int>(direct[i] & 0x7fff) - static_cast<int>(banded[i] & 0x7fff)), 1)
          << "element " << i << ": " << bf16_to_f32(direct[i]) << " against " << bf16_to_f32(banded[i]);
  }
}

// ---------------------------------------------------------------- the seam itself

// Memory of the sim backend's arena is PROT_NONE for the host: any access that bypasses the
// backend dies at once, and a sim operation handed a host address for a device operand aborts.
class SimSeamDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  Backend& sim() { return backend(DeviceKind::sim); }
};

TEST_F(SimSeamDeathTest, HostWriteToDeviceMemoryDies) {
  Buffer buf(256, MemCategory::scratch, MemPlace::device, 64, sim().device_arena());
  volatile float* p = static_cast<float*>(buf.data());
  EXPECT_DEATH(p[3] = 1.0f, "");
}

TEST_F(SimSeamDeathTest, HostReadOfDeviceMemoryDies) {
  Buffer buf(256, MemCategory::scratch, MemPlace::device, 64, sim().device_arena());
  sim().fill_zero(buf.data(), 256);
  volatile const float* p = static_cast<const float*>(buf.data());
  EXPECT_DEATH(std::printf("%f\n", static_cast<double>(p[0])), "");
}

TEST_F(SimSeamDeathTest, OpGivenHostPointerForDeviceOperandAborts) {
  Buffer dev(40 * 4, MemCategory::scratch, MemPlace::device, 64, sim().device_arena());
  std::vector<float> host(40, 1.0f);
  EXPECT_DEATH(sim().relu_forward(static_cast<float*>(dev.data()), host.data(), 40), "is not device memory");
  EXPECT_DEATH(sim().relu_forward(host.data(), static_cast<float*>(dev.data()), 40), "is not device memory");
  EXPECT_DEATH(sim().sum_squares(host.data(), 40), "is not device memory");
  EXPECT_DEATH(sim().copy_to_device(host.data(), dev.data(), 40 * 4), "is not device memory");
  // Through the backend the same memory works.
  sim().copy_to_device(dev.data(), host.data(), 40 * 4);
  EXPECT_EQ(sim().sum(static_cast<float*>(dev.data()), 40), 40.0);
}

// Note [Operand ranges]: each operand is checked over the whole range the operation touches, not
// its first byte. Every buffer below sits alone in its page of the arena, so none of these
// overruns would fault: only the range check catches them.
TEST_F(SimSeamDeathTest, OperandRangeRunningOffItsAllocationAborts) {
  auto dev = [&](size_t floats) { return Buffer(floats * 4, MemCategory::scratch, MemPlace::device, 64, sim().device_arena()); };
  Buffer a = dev(40), b = dev(40);
  float* pa = a.as<float>();
  float* pb = b.as<float>();
  // One element too many, on each operand in turn (the first byte of each is fine).
  EXPECT_DEATH(sim().relu_forward(pa, pb, 41), "runs 4 bytes past its device allocation");
  EXPECT_DEATH(sim().accumulate(pa, pb, 41), "runs 4 bytes past its device allocation");
  EXPECT_DEATH(sim().sum_squares(pa + 1, 40), "runs 4 bytes past its device allocation");
  Buffer wide = dev(128);  // 81 f32 fit; 81 bf16 are 2 bytes more than b's 160
  sim().convert(wide.as<float>(), DType::f32, pb, DType::bf16, 80);
  EXPECT_DEATH(sim().convert(wide.as<float>(), DType::f32, pb, DType::bf16, 81), "runs 2 bytes past its device allocation");
  // A shape that names more than the buffer holds: linear's weight (OC, C) = (5, 8) in 40 floats is
  // fine, OC = 6 runs 32 bytes past it; the output (N, OC) and input (N, C) stay inside theirs.
  Buffer out = dev(64), inp = dev(64);
  sim().linear_forward(out.as<float>(), DType::f32, inp.as<float>(), DType::f32, pa, nullptr, DType::f32, 8, 8, 5);
  EXPECT_DEATH(sim().linear_forward(out.as<float>(), DType::f32, inp.as<float>(), DType::f32, pa, nullptr, DType::f32, 8,
                                    8, 6),
               "runs 32 bytes past its device allocation");
  // The embedding's token table (V, C): V = 5 rows of C = 8 fit, V = 6 runs off (the tokens never
  // reach row 5: the range, not the access, is what is checked).
  Buffer tokens = dev(4), emb = dev(4 * 8);
  sim().embedding_forward(emb.as<float>(), tokens.as<int32_t>(), pa, nullptr, DType::f32, 1, 4, 8, 5);
  EXPECT_DEATH(sim().embedding_forward(emb.as<float>(), tokens.as<int32_t>(), pa, nullptr, DType::f32, 1, 4, 8, 6),
               "runs 32 bytes past its device allocation");
  // Attention's probabilities (B, NH, T, T) = (1, 2, 4, 4) need 32 floats; give it a 31-float view.
  Buffer qkv = dev(4 * 3 * 8), att_out = dev(4 * 8), att = dev(31);
  EXPECT_DEATH(sim().attention_forward(att_out.data(), att.as<float>(), qkv.data(), 1, 4, 8, 2, DType::f32),
               "runs 4 bytes past its device allocation");
  // A copy that starts inside one allocation and runs into memory past it.
  std::vector<float> host(41, 1.0f);
  EXPECT_DEATH(sim().copy_to_device(pa, host.data(), 41 * 4), "runs 4 bytes past its device allocation");
  EXPECT_DEATH(sim().copy_to_host(host.data(), pb, 41 * 4), "runs 4 bytes past its device allocation");
  // Memory given back is no operand either.
  Buffer gone = dev(40);
  float* stale = gone.as<float>();
  gone.reset();
  EXPECT_DEATH(sim().relu_forward(pa, stale, 40), "is not device memory in use");
}

// ---------------------------------------------------------------- CUDA

// Without a GPU (or without the CUDA backend built) every cuda row above is SKIPPED with the
// reason, never passed; this says so once more by name.
TEST(CudaBackend, OfferedExactlyWhenAGpuIsPresent) {
  bool offered = false;
  for (DeviceKind kind : available_devices()) offered = offered || kind == DeviceKind::cuda;
  try {
    Backend& b = backend(DeviceKind::cuda);
    EXPECT_TRUE(offered);
    EXPECT_EQ(b.kind(), DeviceKind::cuda);
    EXPECT_EQ(b.activation_channel_block(), 0);
  } catch (const Error& e) {
    EXPECT_FALSE(offered);
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
    GTEST_SKIP() << e.what();
  }
}

// Note [Pinned host memory]: the inline backends keep the default host arena and have no
// library handles; the cuda one pins host Buffers (zero-filled, aligned as asked, reused zeroed)
// and names its GPU.
TEST(Backend, InlineBackendsHaveNoPinnedArenaNorNativeHandles) {
  for (DeviceKind kind : {DeviceKind::cpu, DeviceKind::sim}) {
    Backend& b = backend(kind);
    EXPECT_EQ(b.host_arena(), nullptr) << device_kind_name(kind);
    EXPECT_EQ(b.device_identity(), "") << device_kind_name(kind);
    EXPECT_EQ(b.native_device(), -1) << device_kind_name(kind);
    EXPECT_EQ(b.native_stream(Stream::comm), nullptr) << device_kind_name(kind);
  }
}

TEST(CudaBackend, HostBuffersArePinnedZeroedAndAligned) {
  bool offered = false;
  for (DeviceKind kind : available_devices()) offered = offered || kind == DeviceKind::cuda;
  if (!offered) GTEST_SKIP() << "no CUDA GPU (or no CUDA backend) on this machine";
#if ZERONE_HAVE_CUDA
  Backend& b = backend(DeviceKind::cuda);
  ASSERT_NE(b.host_arena(), nullptr);
  EXPECT_EQ(b.device_identity().size(), 32u) << b.device_identity();  // the UUID's 16 bytes in hex
  EXPECT_GE(b.native_device(), 0);
  EXPECT_NE(b.native_stream(Stream::host_to_device), b.native_stream(Stream::device_to_host));
  const size_t n = 4099;
  for (size_t alignment : {size_t{64}, size_t{4096}}) {
    for (int round = 0; round < 2; ++round) {  // the second allocation of a size comes from the cache
      Buffer h(n * sizeof(float), MemCategory::comm, MemPlace::host, alignment, *b.host_arena());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(h.data()) % alignment, 0u);
      unsigned flags = 0;
      EXPECT_EQ(cudaHostGetFlags(&flags, h.data()), cudaSuccess) << "not page-locked";
      EXPECT_EQ(b.place_of(h.data()), MemPlace::host);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(h.as<float>()[i], 0.0f) << i;
      // Through the GPU and back on the copy streams.
      for (size_t i = 0; i < n; ++i) h.as<float>()[i] = static_cast<float>(i) + 0.5f;
      Buffer d(n * sizeof(float), MemCategory::scratch, MemPlace::device, 256, b.device_arena());
      b.copy_to_device(d.data(), h.data(), h.bytes());
      std::vector<float> back(n);
      b.copy_to_host(back.data(), d.data(), d.bytes());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], static_cast<float>(i) + 0.5f) << i;
    }
  }
#endif
}

// Note [Asynchronous copies]: on every backend a copy_async in both directions lands once its event
// completed, and its Event may be waited for twice. One case per offered device (named by it, so
// that the GPU run's '*cuda*' filter picks the cuda one: the copy streams and their events).
class AsyncCopies : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(AsyncCopies, LandOnceTheirEventCompleted) {
  Backend& b = backend(GetParam());
  const size_t n = 5003;
  std::vector<float> host(n), back(n, -1.0f);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.25f - 3.0f;
  Buffer d(n * sizeof(float), MemCategory::scratch, MemPlace::device, 256, b.device_arena());
  const MemPlace device_place = b.place_of(d.data());
  Event up = b.copy_async(d.data(), device_place, host.data(), MemPlace::host, d.bytes());
  b.wait(Stream::compute, up);  // the kernels after this read it
  Event down = b.copy_async(back.data(), MemPlace::host, d.data(), device_place, d.bytes());
  down.wait();
  down.wait();
  EXPECT_TRUE(down.ready());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], host[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Devices, AsyncCopies, ::testing::ValuesIn(available_devices()),
                         [](const ::testing::TestParamInfo<DeviceKind>& info) {
                           return std::string(device_kind_name(info.param));
                         });

// Note [Deferred copies]: the simulated device runs a copy_async when its event is observed (or a
// later copy of its direction runs), in order, the destination reading as NaN bytes until then.
TEST(SimBackend, DeferredCopiesRunWhenObservedInOrder) {
  auto& sim = dynamic_cast<sim::SimBackend&>(backend(DeviceKind::sim));
  const uint64_t before = sim.copies_deferred();
  Buffer d(4 * sizeof(float), MemCategory::scratch, MemPlace::device, 64, sim.device_arena());
  const float a[4] = {1, 2, 3, 4}, b2[4] = {5, 6, 7, 8};
  sim.copy_to_device(d.data(), a, sizeof a);
  float first[4] = {}, second[4] = {};
  Event e1 = sim.copy_async(first, MemPlace::host, d.data(), MemPlace::device, sizeof first);
  EXPECT_TRUE(std::isnan(first[0])) << "the destination is undefined until the event";
  Event e2 = sim.copy_async(second, MemPlace::host, d.data(), MemPlace::device, sizeof second);
  EXPECT_EQ(sim.copies_deferred(), before + 2);
  EXPECT_TRUE(e2.ready());  // runs the copies of its direction up to it: e1's first
  EXPECT_EQ(first[3], 4.0f);
  EXPECT_EQ(second[0], 1.0f);
  // The copy reads its source when it runs, not when it is asked for: writing the source before
  // the event (breaking Note [Asynchronous copies]) shows in the result.
  Event e3 = sim.copy_async(first, MemPlace::host, d.data(), MemPlace::device, sizeof first);
  sim.copy_to_device(d.data(), b2, sizeof b2);  // a later copy of the other direction: e3 still pending
  e3.wait();
  EXPECT_EQ(first[0], 5.0f);
  // A synchronous copy of the direction runs what was queued before it.
  Event e4 = sim.copy_async(first, MemPlace::host, d.data(), MemPlace::device, sizeof first);
  sim.copy_to_host(second, d.data(), sizeof second);
  EXPECT_EQ(first[1], 6.0f);
  // Host to device: the device bytes are NaN until the event; wait(stream, event) runs it.
  Event up = sim.copy_async(d.data(), MemPlace::device, a, MemPlace::host, sizeof a);
  sim.wait(Stream::compute, up);
  sim.copy_to_host(second, d.data(), sizeof second);
  EXPECT_EQ(second[2], 3.0f);
  (void)e1;
  (void)e4;
}

// AdamW's operands on one backend's device: master, moments m and v and the gradients (n f32 each,
// v the squares of `moments` / 100 so that it is positive) and a bf16 parameter copy.
struct AdamWOperands {
  AdamWOperands(Backend& on, const std::vector<float>& master, const std::vector<float>& moments,
                const std::vector<float>& grad)
      : backend(on), n(master.size()) {
    std::vector<float> variances(n);
    for (size_t i = 0; i < n; ++i) variances[i] = moments[i] * moments[i] * 1e-2f;
    for (const std::vector<float>* init :
         std::initializer_list<const std::vector<float>*>{&master, &moments, &variances, &grad}) {
      state.emplace_back(n * sizeof(float), MemCategory::scratch, MemPlace::device, 256, on.device_arena());
      on.copy_to_device(state.back().data(), init->data(), n * sizeof(float));
    }
    param = Buffer(n * 2, MemCategory::scratch, MemPlace::device, 256, on.device_arena());
  }
  // adamw_update over [lo, hi).
  double update(size_t lo, size_t hi, const AdamWHyper& h) {
    return backend.adamw_update(f(0) + lo, f(1) + lo, f(2) + lo, f(3) + lo, bf16() + lo, DType::bf16, hi - lo, h).value();
  }
  Backend::AdamWRange range(size_t lo, size_t hi, const AdamWHyper& h) {
    return {f(0) + lo, f(1) + lo, f(2) + lo, f(3) + lo, bf16() + lo, hi - lo, h};
  }
  void set_grad(const std::vector<float>& grad) { backend.copy_to_device(f(3), grad.data(), n * sizeof(float)); }
  // master, m, v and the parameter copy's bits, on the host.
  std::vector<std::vector<uint32_t>> bits() {
    std::vector<std::vector<uint32_t>> out(4, std::vector<uint32_t>(n));
    for (int t = 0; t < 3; ++t) backend.copy_to_host(out[t].data(), f(t), n * sizeof(float));
    std::vector<uint16_t> p(n);
    backend.copy_to_host(p.data(), param.data(), n * 2);
    std::copy(p.begin(), p.end(), out[3].begin());
    return out;
  }
  float* f(int t) { return state[t].as<float>(); }
  uint16_t* bf16() { return static_cast<uint16_t*>(param.data()); }

  Backend& backend;
  const size_t n;
  std::vector<Buffer> state;
  Buffer param;
};

void expect_same_bits(const std::vector<std::vector<uint32_t>>& a, const std::vector<std::vector<uint32_t>>& b) {
  const char* names[] = {"master", "m", "v", "param"};
  for (int t = 0; t < 4; ++t)
    for (size_t i = 0; i < a[t].size(); ++i) ASSERT_EQ(a[t][i], b[t][i]) << names[t] << "[" << i << "]";
}

AdamWHyper adamw_case_hyper(int step) {
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.grad_scale = 0.5f;
  h.step = step;
  return h;
}

// Note [AdamW lanes]: an element's update does not depend on where the range it is updated in
// starts or ends (vector body or scalar tail, thread split), so that a parameter sharded anywhere
// (ZeRO stages, world sizes, the early per-unit step) gets the same bits. Whole against three
// pieces that cut through the vector blocks, with a bf16 parameter copy, over two steps.
class AdamWSplits : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(AdamWSplits, UpdateEveryElementAsTheWholeRangeWould) {
  const size_t n = 1000;
  const size_t cuts[] = {0, 37, 530, n};
  const std::vector<float> master = randn(n, 901), grad = randn(n, 902), moments = randn(n, 903, 0.01);
  AdamWOperands whole(backend(GetParam()), master, moments, grad), pieces(backend(GetParam()), master, moments, grad);
  for (int step = 1; step <= 2; ++step) {
    whole.update(0, n, adamw_case_hyper(step));
    for (size_t k = 0; k + 1 < std::size(cuts); ++k) pieces.update(cuts[k], cuts[k + 1], adamw_case_hyper(step));
  }
  expect_same_bits(whole.bits(), pieces.bits());
}

// Backend::adamw_update_ranges: the updates and the sum of adamw_update range by range, to the
// bit (on a GPU one wait for all the ranges: Note [Updates that measure the norm]), each range
// with hyperparameters of its own.
void expect_ranges_as_one_call_each(DeviceKind device, const std::vector<size_t>& sizes) {
  size_t n = 0;
  for (size_t k : sizes) n += k;
  const std::vector<float> master = randn(n, 911), grad = randn(n, 912), moments = randn(n, 913, 0.01);
  AdamWOperands together(backend(device), master, moments, grad), apart(backend(device), master, moments, grad);
  std::vector<Backend::AdamWRange> ranges;
  double each = 0.0;
  size_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    AdamWHyper h = adamw_case_hyper(3);
    h.lr *= static_cast<float>(k + 1);
    h.weight_decay = k % 2 ? 0.0f : 0.1f;
    ranges.push_back(together.range(at, at + sizes[k], h));
    each += apart.update(at, at + sizes[k], h);
    at += sizes[k];
  }
  const double one_call = backend(device).adamw_update_ranges(ranges, DType::bf16).value();
  EXPECT_EQ(std::bit_cast<uint64_t>(one_call), std::bit_cast<uint64_t>(each));
  EXPECT_GT(one_call, 0.0);
  expect_same_bits(together.bits(), apart.bits());
}

// Ranges of 0, 1, 300 and 40000 elements (three norm chunks).
TEST_P(AdamWSplits, RangesUpdateAndSumAsOneCallEach) { expect_ranges_as_one_call_each(GetParam(), {300, 0, 40000, 1}); }

// Note [AdamW ranges in one launch]: more ranges than one launch takes (a GPU splits them over
// several: 16, 16 and 3 non-empty ones), of one element, of one chunk, one past it, empty.
TEST_P(AdamWSplits, ManyRangesAsOneCallEach) {
  std::vector<size_t> sizes;
  for (int k = 0; k < 41; ++k) sizes.push_back(std::vector<size_t>{1, 17, 300, 16384, 16385, 0, 2}[k % 7]);
  expect_ranges_as_one_call_each(GetParam(), sizes);
}

// Note [AdamW lanes]: every device computes the host kernel's function of each element, so an
// update on the GPU and one offloaded to the host (--offload-optimizer cpu) give the same bits:
// master, moments and the bf16 copy, over three steps with weight decay and a gradient scale
// (the norm's sum is the device's own order and is compared within its rounding).
TEST_P(AdamWSplits, MatchTheHostBitForBit) {
  const size_t n = 40000 + 77;
  const std::vector<float> master = randn(n, 921), moments = randn(n, 923, 0.01);
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(randn(n, 930 + s));
  AdamWOperands on_device(backend(GetParam()), master, moments, grads[0]), on_host(host_backend(), master, moments, grads[0]);
  for (int step = 1; step <= 3; ++step) {
    on_device.set_grad(grads[step - 1]);
    on_host.set_grad(grads[step - 1]);
    const double device_sum = on_device.update(0, n, adamw_case_hyper(step));
    const double host_sum = on_host.update(0, n, adamw_case_hyper(step));
    EXPECT_NEAR(device_sum, host_sum, 1e-12 * host_sum) << step;
  }
  expect_same_bits(on_device.bits(), on_host.bits());
}

// Note [AdamW lanes]: the loop for CPUs without AVX-512 computes the AVX-512 pass's function, so
// that a host without it (an AMD Zen 3 offloading for a GPU) updates to the same bits. Both passes
// on this CPU (skipped where it has no AVX-512: then only the loop runs anyway).
TEST(AdamWPasses, ThePortableLoopGivesTheAvx512PassesBits) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512 here: one pass only";
  const size_t n = 40000 + 77;
  const std::vector<float> master = randn(n, 941), moments = randn(n, 943, 0.01), grad = randn(n, 944);
  AdamWOperands fast(host_backend(), master, moments, grad), portable(host_backend(), master, moments, grad);
  for (int step = 1; step <= 3; ++step) {
    const double fast_sum = fast.update(0, n, adamw_case_hyper(step));
    cpu::set_adamw_pass(cpu::AdamWPass::portable);
    const double portable_sum = portable.update(0, n, adamw_case_hyper(step));
    cpu::set_adamw_pass(cpu::AdamWPass::automatic);
    EXPECT_NEAR(fast_sum, portable_sum, 1e-12 * fast_sum);
  }
  expect_same_bits(fast.bits(), portable.bits());
}

INSTANTIATE_TEST_SUITE_P(Devices, AdamWSplits, ::testing::ValuesIn(available_devices()),
                         [](const ::testing::TestParamInfo<DeviceKind>& info) {
                           return std::string(device_kind_name(info.param));
                         });

}  // namespace
}  // namespace zerone::kernels
