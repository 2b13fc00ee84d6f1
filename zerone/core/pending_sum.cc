#include "zerone/core/pending_sum.h"

#include <atomic>
#include <cstdint>

#include "zerone/core/error.h"

namespace zerone {
namespace {
std::atomic<uint64_t> g_leaves_made{0};  // the leaves' creation order (PendingSum::value)
}  // namespace

// A pending expression: a leaf (partials behind an event) or a sum of two PendingSums.
struct PendingSum::Node {
  // Leaf.
  uint64_t sequence = 0;  // made after every leaf of a lower one
  std::shared_ptr<const double> partials;
  std::vector<size_t> groups;
  Event ready;
  // Sum: left + right (a leaf's are unused).
  bool is_sum = false;
  mutable PendingSum left, right;  // mutable: the destructor unlinks the left spine

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // A running total is a left spine as deep as its terms (thousands for a large model's step):
  // released one node at a time here, not by recursing through the destructors.
  ~Node() {
    std::shared_ptr<const Node> next = std::move(left.node_);
    while (next != nullptr && next.use_count() == 1) next = std::move(next->left.node_);
  }

  // A leaf's event is waited for only where it is not complete yet (value() waited for the newest).
  double leaf_value() const {
    if (!ready.ready()) ready.wait();
    double total = 0.0;
    size_t at = 0;
    for (size_t count : groups) {
      double group = 0.0;
      for (size_t i = 0; i < count; ++i) group += partials.get()[at + i];
      at += count;
      total += group;
    }
    return total;
  }
};

PendingSum PendingSum::of_partials(std::shared_ptr<const double> partials, std::vector<size_t> groups, Event ready) {
  size_t total = 0;
  for (size_t g : groups) total += g;
  ZERONE_ASSERT(total == 0 || partials != nullptr, "partial sums without their memory");
  auto node = std::make_shared<Node>();
  node->sequence = ++g_leaves_made;
  node->partials = std::move(partials);
  node->groups = std::move(groups);
  node->ready = std::move(ready);
  return PendingSum(std::shared_ptr<const Node>(std::move(node)));
}

PendingSum operator+(const PendingSum& a, const PendingSum& b) {
  if (a.known() && b.known()) return PendingSum(a.known_ + b.known_);
  auto node = std::make_shared<PendingSum::Node>();
  node->is_sum = true;
  node->left = a;
  node->right = b;
  return PendingSum(std::shared_ptr<const PendingSum::Node>(std::move(node)));
}

double PendingSum::value() const {
  // The host waits once, for the newest leaf (the last made, wherever the expression holds it:
  // the speculative step adds units in shard order that were measured top down): the leaves are
  // mostly the copies of one stream, whose earlier events are complete once a later one is, so
  // the rest are then read without another wait (leaf_value waits for any that is not).
  const Node* newest = nullptr;
  std::vector<const PendingSum*> to_visit{this};
  while (!to_visit.empty()) {
    const PendingSum* at = to_visit.back();
    to_visit.pop_back();
    if (at->known()) continue;
    if (at->node_->is_sum) {
      to_visit.push_back(&at->node_->left);
      to_visit.push_back(&at->node_->right);
    } else if (newest == nullptr || at->node_->sequence > newest->sequence) {
      newest = at->node_.get();
    }
  }
  if (newest != nullptr) newest->ready.wait();
  return added();
}

double PendingSum::added() const {
  // Sums grow to the left (a running total plus the next term), so the left spine is walked
  // without recursion: its depth is the number of terms added; each right side is one term.
  std::vector<const Node*> spine;
  const PendingSum* at = this;
  while (!at->known() && at->node_->is_sum) {
    spine.push_back(at->node_.get());
    at = &at->node_->left;
  }
  double total = at->known() ? at->known_ : at->node_->leaf_value();
  for (auto it = spine.rbegin(); it != spine.rend(); ++it) total += (*it)->right.added();
  return total;
}

}  // namespace zerone
