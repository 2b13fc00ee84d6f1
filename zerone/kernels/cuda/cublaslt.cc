#include "zerone/kernels/cuda/cublaslt.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "zerone/core/error.h"

namespace zerone::cuda {
namespace {

std::atomic<bool> g_loaded{false};

// Opens the library by soname, then at the build's toolkit path; nullptr and the messages if neither opens.
void* open_library(std::string& tried) {
  const std::string candidates[] = {ZERONE_CUBLASLT_SONAME, std::string(ZERONE_CUBLASLT_DIR) + "/" + ZERONE_CUBLASLT_SONAME};
  for (const std::string& file : candidates) {
    if (void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = dlerror();
    tried += str_cat(tried.empty() ? "" : "; ", why ? why : file.c_str());
  }
  return nullptr;
}

template <typename Fn>
void resolve(void* handle, const char* name, Fn& out) {
  void* symbol = dlsym(handle, name);
  ZERONE_CHECK(symbol != nullptr, "cuBLASLt (", ZERONE_CUBLASLT_SONAME, ") has no ", name,
               ": it is not the CUDA ", ZERONE_CUBLASLT_SONAME, " zerone was built with");
  out = reinterpret_cast<Fn>(symbol);
}

CublasLtLibrary load() {
  std::string tried;
  void* handle = open_library(tried);
  ZERONE_CHECK(handle != nullptr, "--device cuda needs cuBLASLt (", ZERONE_CUBLASLT_SONAME,
               ", from the CUDA toolkit or PyTorch's nvidia-cublas wheel), which could not be loaded: ", tried);
  CublasLtLibrary lib{};
  resolve(handle, "cublasLtCreate", lib.create);
  resolve(handle, "cublasLtDestroy", lib.destroy);
  resolve(handle, "cublasLtGetVersion", lib.get_version);
  resolve(handle, "cublasLtMatmul", lib.matmul);
  resolve(handle, "cublasLtMatmulAlgoGetHeuristic", lib.algo_get_heuristic);
  resolve(handle, "cublasLtMatmulDescCreate", lib.desc_create);
  resolve(handle, "cublasLtMatmulDescDestroy", lib.desc_destroy);
  resolve(handle, "cublasLtMatmulDescSetAttribute", lib.desc_set_attribute);
  resolve(handle, "cublasLtMatmulPreferenceCreate", lib.preference_create);
  resolve(handle, "cublasLtMatmulPreferenceDestroy", lib.preference_destroy);
  resolve(handle, "cublasLtMatmulPreferenceSetAttribute", lib.preference_set_attribute);
  resolve(handle, "cublasLtMatrixLayoutCreate", lib.layout_create);
  resolve(handle, "cublasLtMatrixLayoutDestroy", lib.layout_destroy);
  g_loaded = true;
  return lib;  // the handle stays open for the process's life
}

}  // namespace

const CublasLtLibrary& cublaslt() {
  static std::mutex mutex;
  static CublasLtLibrary library{};
  std::lock_guard<std::mutex> lock(mutex);
  if (!g_loaded) library = load();
  return library;
}

bool cublaslt_loaded() { return g_loaded; }

}  // namespace zerone::cuda
