// Note [Known GPU peaks] (kernels/backend.h): the names the driver reports map to the right part.
#include <gtest/gtest.h>

#include "zerone/kernels/backend.h"

namespace zerone::kernels {
namespace {

double peak_of(const std::string& name, DType dtype = DType::bf16) {
  const std::optional<GpuPeak> p = known_gpu_peak(name, dtype);
  return p ? p->dense_16bit_tflops : 0.0;
}

TEST(KnownGpuPeak, NamesTheDriverReports) {
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA H100 80GB HBM3"), 989.4);  // SXM
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA H100 NVL"), 835.0);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA H200 NVL"), 835.0);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA GH200 480GB"), 989.4);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA A100 80GB PCIe"), 312.0);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA L40S"), 362.05);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA L4"), 121.0);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA A10"), 125.0);
  EXPECT_DOUBLE_EQ(peak_of("NVIDIA H100 80GB HBM3", DType::f16), 989.4);
  EXPECT_EQ(known_gpu_peak("NVIDIA H100 80GB HBM3", DType::f32), std::nullopt);  // no single f32 peak
  EXPECT_EQ(known_gpu_peak("NVIDIA GeForce RTX 4090", DType::bf16), std::nullopt);
  EXPECT_STREQ(known_gpu_peak("NVIDIA H100 80GB HBM3", DType::bf16)->product, "NVIDIA H100 SXM");
}

}  // namespace
}  // namespace zerone::kernels
