// Note [Backend scratch] (kernels/scratch.h): a model's forward and backward on the cuda backend
// (here on the emulated GPU: Note [Emulated warps]) leave the backend's scratch slots holding, to
// the byte, what the model's ScratchCount says, which is what `zerone estimate` counts for them;
// and the slots grow without holding old and new memory at once (the ledger's peak is the same).
#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"
#include "zerone/kernels/scratch.h"
#include "zerone/nn/model.h"

namespace zerone {
namespace {

struct ScratchCase {
  std::string name, spec;
  DType dtype;
  int B, T;
  bool checkpointing = false;
};
void PrintTo(const ScratchCase& c, std::ostream* os) { *os << c.name; }

class BackendScratch : public ::testing::TestWithParam<ScratchCase> {};

// The device scratch in the ledger now.
int64_t device_scratch() { return MemoryLedger::global().current(MemPlace::device, MemCategory::scratch); }

TEST_P(BackendScratch, LedgerEqualsTheModelsCount) {
  const ScratchCase& c = GetParam();
  testing::DeviceScope cuda(kernels::DeviceKind::cuda);
  kernels::Backend& backend = kernels::device_backend();
  backend.release_cached_memory();  // every slot empty: this case's calls alone fill them
  std::unique_ptr<nn::Model> model = nn::make_model(c.spec, c.dtype);
  model->set_activation_checkpointing(c.checkpointing);
  model->init_weights(7);
  const int64_t before = device_scratch();
  MemoryLedger::global().reset_peaks();

  nn::Batch batch;
  batch.size = c.B;
  batch.seq = c.T;
  batch.training = true;
  std::vector<int32_t> tokens, targets;
  std::vector<float> features;
  if (model->input_kind() == nn::InputKind::tokens) {
    for (int i = 0; i < c.B * c.T; ++i) tokens.push_back((i * 7 + 3) % model->vocab_size());
    for (int i = 0; i < c.B * c.T; ++i) targets.push_back((i * 5 + 1) % model->vocab_size());
    batch.tokens = tokens.data();
  } else {
    size_t per_sample = 1;
    for (int64_t d : model->input_shape()) per_sample *= static_cast<size_t>(d);
    for (size_t i = 0; i < per_sample * c.B; ++i) features.push_back(static_cast<float>(i % 13) / 13.0f);
    for (int i = 0; i < c.B; ++i) targets.push_back(i % model->vocab_size());
    batch.features = features.data();
  }
  batch.targets = targets.data();
  model->forward(batch);
  model->backward(1.0f);
  model->forward(batch);  // a second step's calls need nothing more
  model->backward(1.0f);
  backend.synchronize(kernels::Stream::compute);

  const kernels::ScratchCount count = model->scratch_count(c.B, c.T);
  const int64_t held = device_scratch() - before;
  EXPECT_GT(count.slot_bytes(kernels::ScratchSlot::gemm_workspace), 0) << "every model here runs GEMMs";
  EXPECT_EQ(held, count.bytes()) << c.spec;
  EXPECT_EQ(MemoryLedger::global().peak(MemPlace::device, MemCategory::scratch) - before, held)
      << "a slot grew while its old memory was still held";

  // The count asked the backend where the tensor-core attention runs (the emulated GPU: as sm_90).
  EXPECT_TRUE(backend.tensor_core_attention(DType::bf16, 64));
  EXPECT_FALSE(backend.tensor_core_attention(DType::f32, 64));
  EXPECT_FALSE(backend.tensor_core_attention(DType::bf16, 24)) << "not a head size it is built for";
  // The same model counted for the other devices: their scratch is host memory, counted as none.
  model->count_for_device(kernels::DeviceKind::cpu, {});
  EXPECT_EQ(model->scratch_count(c.B, c.T).bytes(), 0);
  backend.release_cached_memory();
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, BackendScratch,
    ::testing::Values(
        // GPT-2 at head size 16 (the tensor-core attention) and 24 (the f32 flash form on a widened qkv).
        ScratchCase{"gpt2_f32", "gpt2:layers=2,dim=64,heads=4,vocab=257,ctx=32", DType::f32, 3, 32},
        ScratchCase{"gpt2_bf16", "gpt2:layers=2,dim=64,heads=4,vocab=257,ctx=32", DType::bf16, 3, 32},
        ScratchCase{"gpt2_fp16_checkpointing", "gpt2:layers=2,dim=64,heads=4,vocab=257,ctx=32", DType::f16, 2, 32, true},
        ScratchCase{"gpt2_bf16_head24", "gpt2:layers=1,dim=48,heads=2,vocab=100,ctx=16", DType::bf16, 2, 16},
        // LLaMA with grouped-query attention.
        ScratchCase{"llama_bf16_gqa", "llama:layers=2,dim=64,heads=4,kv_heads=2,ffn=96,vocab=128,ctx=32", DType::bf16, 2, 32},
        ScratchCase{"llama_f32_gqa", "llama:layers=1,dim=64,heads=4,kv_heads=1,ffn=96,vocab=128,ctx=32", DType::f32, 2, 16},
        // The image classifiers: linear layers on f32 activations, convolutions, the classifier's hits.
        ScratchCase{"mnist_mlp_bf16", "mnist-mlp", DType::bf16, 4, 1},
        ScratchCase{"mnist_cnn_f32", "mnist-cnn", DType::f32, 2, 1}),
    [](const ::testing::TestParamInfo<ScratchCase>& info) { return info.param.name; });

}  // namespace
}  // namespace zerone
