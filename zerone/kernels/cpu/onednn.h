// The oneDNN engine and stream every CPU kernel here executes on (one per process).
//
// Thread-safety: onednn() is safe to call from any thread (a function-local static); executing
// primitives on the stream is the caller's business (the kernels run one at a time, from the
// training thread, each on oneDNN's OpenMP team).
#pragma once

#include <dnnl.hpp>

#include "zerone/core/dtype.h"

namespace zerone::kernels::cpu {

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

OneDnn& onednn();

// oneDNN's name for a zerone dtype.
dnnl::memory::data_type to_dnnl(DType dtype);

}  // namespace zerone::kernels::cpu
