// PendingSum: a double that a device may still be computing — a gradient's sum of squares, which
// the backends return from sum_squares and the optimizer updates (kernels/backend.h) — read by
// the host only when it needs the value (Note [Norms read once a step]).
//
// A PendingSum is either a known value (every host backend returns one) or an expression of `+`
// over pending leaves, each leaf a device's partial sums copied to host memory behind an Event.
// value() waits for the leaves' events (the newest first: Note [Norms read once a step]) and then
// adds exactly as the expression says, each `+` in the order it was written, so that a + b + c
// read late is, to the bit, what adding the three values as they came would have given (IEEE
// addition is not associative: the tree is kept, never flattened).
//
// Thread-safety: a PendingSum is an immutable value (copies share its leaves); value() may be
// called from any thread, as often as wanted (it waits and adds again each time). The leaves'
// host memory is owned by the PendingSums that refer to it and freed with the last of them.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "zerone/core/event.h"

namespace zerone {

// Note [Norms read once a step]: a GPU returns a sum of squares as per-chunk double partials
// (Note [Deterministic gradient norm], kernels/cpu/reduce.h) that the host adds in chunk order.
// Reading them as each update returns would make the host wait for the device's queue to drain
// once per update — a unit at a time during the backward (the early step), then once per unit
// again at the end — and each wait empties the queue that keeps the GPU busy: the GPU then idles
// while the host launches the next kernels. Instead each update copies its partials to pinned
// host memory on its own stream and returns them as a PendingSum; the engine adds the units'
// PendingSums as it goes and reads the total once, when the step needs the norm (to clip, to
// report, to detect an overflow). Where the norm must be known before any update (clipping, fp16
// loss scaling) the units' sums of squares are likewise launched one after another and read
// once; the updates' own sums, not needed there, are then never waited for. Reading waits for the
// newest leaf (the last made) first: once it is complete the older ones of the same stream are
// too, so the norm costs a step one wait of the host (tests/zero/host_waits_emulated_test.cc
// counts the waits of a step on the emulated GPU; the offloaded paths have waits of their own,
// for their copies: Note [Operands in another place], optim/optimizer.h). A leaf's host memory
// may be dropped unread while its copy is queued: Note [Partial sums' host blocks]
// (kernels/cuda/cuda_backend.cc) says where it goes.
class PendingSum {
 public:
  // 0.0, known.
  PendingSum() = default;
  // A known value (implicit: host backends return their double as it is).
  PendingSum(double value) : known_(value) {}  // NOLINT(google-explicit-constructor)

  // The sum a device is computing: `partials` (host memory, `groups` sizes in order, their total
  // the number of partials) is valid once `ready` is complete; the value is each group's partials
  // added in order from 0.0, and those group sums added in order from 0.0. `partials` is kept
  // alive (and released) by the PendingSums made from this one.
  static PendingSum of_partials(std::shared_ptr<const double> partials, std::vector<size_t> groups, Event ready);

  // Whether value() would not wait.
  bool known() const { return node_ == nullptr; }
  // The value; waits for the device where a leaf is not ready yet.
  double value() const;

  // a + b: the value of a plus the value of b, added when read (known now when both are).
  friend PendingSum operator+(const PendingSum& a, const PendingSum& b);
  PendingSum& operator+=(const PendingSum& b) { return *this = *this + b; }

 private:
  struct Node;
  explicit PendingSum(std::shared_ptr<const Node> node) : node_(std::move(node)) {}
  // The value, waiting only for leaves not complete yet (value() first waits for the newest).
  double added() const;
  double known_ = 0.0;
  std::shared_ptr<const Node> node_;  // null: known_
};

}  // namespace zerone
