// The training loop (one rank): builds the model, the data, the optimizer; runs optimizer steps of
// `grad_accum` micro-steps; clips, steps AdamW, validates, reports metrics and progress.
//
// With no --data the run is the default run (DESIGN §4): a small GPT on the built-in Markov
// corpus, ending with "final loss L nats/token; source entropy H nats/token".
// Thread-safety: one run per process at a time (kernels use the whole OpenMP team).
#pragma once

#include <optional>

#include "zerone/comm/communicator.h"
#include "zerone/io/fault_env.h"
#include "zerone/nn/gpt2.h"
#include "zerone/optim/optimizer.h"
#include "zerone/train/config.h"
#include "zerone/optim/swapped.h"
#include "zerone/zero/partition.h"

namespace zerone::train {

struct TrainResult {
  int steps = 0;
  float final_train_loss = 0.0f;
  std::optional<float> final_val_loss;
  std::optional<float> final_val_accuracy;  // classifiers
  std::optional<double> source_entropy;  // the default run's floor
  int interrupted_by = 0;                // SIGINT/SIGTERM that stopped the run early (Note [Interrupts]); 0: ran to the end
};

// The default run's settings, applied to fields the user left at their defaults.
TrainConfig default_run_config(TrainConfig cfg);

// Runs training on this rank of `comm` (every rank calls it with the same config); rank 0 prints
// progress and writes metrics and checkpoints. Throws Error for bad input (files, flags, values, a
// configuration that differs between ranks).
// `env`: the test hooks (io/fault_env.h); it must outlive the call.
TrainResult run_training(TrainConfig cfg, comm::Communicator& comm, const io::FaultEnv& env = io::FaultEnv::none());

// The settings as the run will use them: the default run's, DeepSpeed's batch arithmetic at this
// world size, image data's validation split; validated. run_training starts with it; --print-config
// prints it.
TrainConfig resolve_settings(TrainConfig cfg, int world_size);
// The same at world size 1.
TrainResult run_training(TrainConfig cfg);

// The ZeRO engine's settings derived from the run's settings, once, for train and estimate:
// stages, buckets, offload places, the early step and whether it may speculate (Note [Speculative
// early step]; `dtype` decides fp16 loss scaling). `env` supplies the test-only speculation knob.
// The "auto" sizes (0: reduce_bucket_size, sub_group_size) are resolved for the model's units
// `unit_numels` at `world` ranks (Note [Auto sizes] in zero/planner.cc).
zero::ZeroConfig zero_config(const TrainConfig& cfg, DType dtype, const std::vector<size_t>& unit_numels, int world,
                             const io::FaultEnv& env = io::FaultEnv::none());
// The NVMe swap settings of rank `rank` (with `env`'s fault plans for tests).
optim::NvmeConfig nvme_config(const TrainConfig& cfg, int rank, const io::FaultEnv& env = io::FaultEnv::none());
// The optimizer the settings name.
optim::OptimizerOptions optimizer_options(const TrainConfig& cfg);
// The device backend's choices the settings name (--cuda-attention); the device itself is
// kernels::device_or_default(cfg.device).
kernels::DeviceOptions device_options(const TrainConfig& cfg);

// Note [Refuse what cannot fit]: throws Error, one message naming the bytes needed and available
// and the settings that would fit, when the run of `cfg` on `model` cannot fit before anything is
// allocated. `device` is the run's device and `device_memory` its memory when it is not host
// memory (the backend's device_memory(): the GPU's free and total bytes); both are data so that
// the check for a GPU runs anywhere (tests). `route` is how the run's collectives move
// (zero::collective_route), which decides the host bytes they stage. The host's memory and the NVMe
// free space are read here.
void check_memory_fits(const nn::Model& model, DType dtype, const TrainConfig& cfg, const zero::ZeroConfig& zcfg,
                       int world, kernels::DeviceKind device, const std::optional<kernels::DeviceMemory>& device_memory,
                       zero::CollectiveRoute route);

// Chooses the compute dtype: cfg.precision if set, else bf16 where the CPU has native bf16 dot
// products (AVX512-BF16 or AMX), else fp32.
DType resolve_precision(const std::string& precision);

}  // namespace zerone::train
