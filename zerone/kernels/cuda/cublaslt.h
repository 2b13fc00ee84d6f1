// cuBLASLt, loaded when a GPU needs it. The CUDA backend's GEMMs are cuBLASLt's; this is the one
// place that reaches the library: a table of the entry points zerone calls, resolved from the
// shared library (dlopen) the first time `cublaslt()` is called, never at program start.
//
// Note [cuBLASLt loaded on first use]: linking libcublasLt made every zerone process pay for it
// at start-up, GPU or not: its static initializers fault in about 210 MB of tables and take about
// 0.1 s before main() (measured: an empty program linked with it alone has a 211 MB peak RSS;
// zerone's `version` took 0.09 s and 223 MB). A CPU run at 4 ranks carried 0.8 GB that no ZeRO
// formula counts, in every peak RSS it reported, and every test's process paid the 0.1 s. Now
// only a process that makes a CUDA backend (or `zerone info`, which prints the version) loads it.
// The library is looked up by its soname first (the dynamic loader's search: LD_LIBRARY_PATH, the
// executable's run path, the system's cache: where PyTorch's nvidia wheels put it on a GPU
// machine), then at the path of the toolkit zerone was built with.
//
// Thread-safety: `cublaslt()` may be called from any thread; the first call loads the library
// once (a function-local static), later calls return the same table. The table is never unloaded.
#pragma once

#include <cublasLt.h>

namespace zerone::cuda {

// The cuBLASLt functions the backend calls, with cuBLASLt's own signatures.
struct CublasLtLibrary {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtGetVersion) get_version;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&::cublasLtMatmulDescCreate) desc_create;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy;
};

// The loaded library. Throws Error (once per call, the load is retried by the next call) naming
// the files tried and the loader's message when the library cannot be opened or lacks an entry
// point (a toolkit other than the one zerone was built with).
const CublasLtLibrary& cublaslt();

// Whether this process has loaded cuBLASLt (for tests: a CPU run never does).
bool cublaslt_loaded();

}  // namespace zerone::cuda
