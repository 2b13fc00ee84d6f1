#include "zerone/core/sysinfo.h"

#include <cpuid.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace zerone {

CpuInfo cpu_info() {
  CpuInfo info;
  info.logical_cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) info.model_name = line.substr(colon + 2);
      break;
    }
  }
  __builtin_cpu_init();
  info.avx2 = __builtin_cpu_supports("avx2");
  info.avx512f = __builtin_cpu_supports("avx512f");
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) info.avx512_bf16 = (eax >> 5) & 1;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    info.amx_bf16 = (edx >> 22) & 1;
    info.amx_tile = (edx >> 24) & 1;
  }
  return info;
}

long long physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<long long>(pages) * page_size : 0;
}

namespace {

// The first number in `path` (e.g. "max" gives none), or -1.
long long read_number(const char* path) {
  std::ifstream in(path);
  long long value = -1;
  if (in >> value) return value;
  return -1;
}

}  // namespace

long long available_memory_bytes() {
  long long available = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      available = std::stoll(line.substr(13)) * 1024;  // "MemAvailable:   123456 kB"
      break;
    }
  }
  long long limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) {
    long long room = limit > used ? limit - used : 0;
    if (available == 0 || room < available) available = room;
  }
  return available;
}

}  // namespace zerone
