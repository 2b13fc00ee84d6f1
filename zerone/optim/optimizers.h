// Which optimizer a run uses and how to build it over the shards the ZeRO engine hands out: the
// options of one of the optimizers (adamw.h, sgd.h) name it.
//
// Thread-safety: plain values; make_optimizer is reentrant.
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "zerone/optim/adamw.h"
#include "zerone/optim/sgd.h"

namespace zerone::optim {

using OptimizerOptions = std::variant<AdamWOptions, SGDOptions>;

// "adamw" or "sgd".
std::string optimizer_name(const OptimizerOptions& options);

// f32 tensors per parameter element the optimizer keeps besides the fp32 master (which every
// optimizer keeps for bf16/fp16 parameters only), memory category `optim`: AdamW 2 (exp_avg,
// exp_avg_sq); SGD 1 (the momentum buffer) when momentum is not 0, else 0. zerone estimate
// sizes the optimizer state with it (zero/partition.h).
int optimizer_state_tensors(const OptimizerOptions& options);

// The in-memory optimizer the options name, its state on `state_place`. Throws Error for options
// the optimizer refuses (e.g. Nesterov without momentum).
std::unique_ptr<Optimizer> make_optimizer(std::vector<ShardRef> shards, DType param_dtype,
                                          const OptimizerOptions& options, MemPlace state_place);

}  // namespace zerone::optim
