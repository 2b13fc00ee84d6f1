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

// The in-memory optimizer the options name, its state on `state_place`. Throws Error for options
// the optimizer refuses (e.g. Nesterov without momentum).
std::unique_ptr<Optimizer> make_optimizer(std::vector<ShardRef> shards, DType param_dtype,
                                          const OptimizerOptions& options, MemPlace state_place);

}  // namespace zerone::optim
