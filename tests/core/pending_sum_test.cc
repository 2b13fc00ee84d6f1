#include "zerone/core/pending_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

namespace zerone {
namespace {

uint64_t bits(double x) { return std::bit_cast<uint64_t>(x); }

// An event that counts the host's waits, complete once waited for (or released).
struct CountingEvent final : Event::Impl {
  mutable std::atomic<int> waits{0};
  mutable std::atomic<bool> complete{false};
  bool ready() const override { return complete.load(); }
  void wait() const override {
    ++waits;
    complete = true;
  }
};

std::shared_ptr<const double> partials_of(std::vector<double> values) {
  auto* data = new double[values.size()];
  for (size_t i = 0; i < values.size(); ++i) data[i] = values[i];
  return std::shared_ptr<const double>(data, [](const double* p) { delete[] p; });
}

TEST(PendingSum, KnownValuesAddAtOnce) {
  const PendingSum a = 0.1, b = 0.2;
  const PendingSum sum = a + b;
  EXPECT_TRUE(sum.known());
  EXPECT_EQ(bits(sum.value()), bits(0.1 + 0.2));
  EXPECT_EQ(PendingSum().value(), 0.0);
}

// Note [Norms read once a step]: a leaf is each group's partials added in order, then the groups
// in order; not one flat sum (1e16 + 1 + 1 is 1e16 flat, 1e16 + 2 in groups {1, 2}).
TEST(PendingSum, LeafAddsEachGroupThenTheGroups) {
  auto event = std::make_shared<CountingEvent>();
  const PendingSum leaf = PendingSum::of_partials(partials_of({1e16, 1.0, 1.0}), {1, 2}, Event(event));
  EXPECT_FALSE(leaf.known());
  EXPECT_EQ(event->waits.load(), 0);
  const double expected = 1e16 + (1.0 + 1.0);
  ASSERT_NE(bits(expected), bits((1e16 + 1.0) + 1.0));  // the case tells the orders apart
  EXPECT_EQ(bits(leaf.value()), bits(expected));
  EXPECT_EQ(event->waits.load(), 1);
  const PendingSum empty = PendingSum::of_partials(nullptr, {0, 0}, Event());
  EXPECT_EQ(empty.value(), 0.0);
}

// Adding pending sums waits for nothing; reading the total waits for each leaf once and adds in
// the order the + were written: ((0 + a) + b) + c, as a running total of doubles would.
TEST(PendingSum, TotalIsTheRunningTotalAndWaitsOnlyWhenRead) {
  const std::vector<double> terms = {1e16, 1.0, 1.0, 3.5, -1e16, 0.25};
  auto event = std::make_shared<CountingEvent>();
  PendingSum total;
  double running = 0.0;
  for (size_t i = 0; i < terms.size(); ++i) {
    running += terms[i];
    if (i % 2 == 0) total += PendingSum::of_partials(partials_of({terms[i]}), {1}, Event(event));
    else total += terms[i];
  }
  EXPECT_EQ(event->waits.load(), 0);
  EXPECT_FALSE(total.known());
  EXPECT_EQ(bits(total.value()), bits(running));
  EXPECT_EQ(event->waits.load(), 1);  // for the newest leaf; the others are then complete
  // Grouping by the caller is kept too: a + (b + c) is not flattened into (a + b) + c.
  const PendingSum a = PendingSum::of_partials(partials_of({1e16}), {1}, Event());
  const PendingSum nested = a + (PendingSum(1.0) + PendingSum::of_partials(partials_of({1.0}), {1}, Event()));
  EXPECT_EQ(bits(nested.value()), bits(1e16 + (1.0 + 1.0)));
}

// Leaves of events that complete apart (other streams): the newest is waited for first, then
// each older one that is not complete yet; complete ones are not waited for.
TEST(PendingSum, WaitsForEachLeafNotCompleteYet) {
  auto older = std::make_shared<CountingEvent>(), done = std::make_shared<CountingEvent>(),
       newer = std::make_shared<CountingEvent>();
  done->complete = true;
  const PendingSum total = PendingSum::of_partials(partials_of({1.0}), {1}, Event(older)) +
                           PendingSum::of_partials(partials_of({2.0}), {1}, Event(done)) + 4.0 +
                           PendingSum::of_partials(partials_of({8.0}), {1}, Event(newer)) + 16.0;
  EXPECT_EQ(total.value(), 31.0);
  EXPECT_EQ(newer->waits.load(), 1);
  EXPECT_EQ(older->waits.load(), 1);
  EXPECT_EQ(done->waits.load(), 0);
}

// One stream's events: waiting for one completes it and every event recorded before it.
struct Stream {
  int waits = 0;
  uint64_t completed = 0;
};
struct StreamEvent final : Event::Impl {
  StreamEvent(Stream& s, uint64_t k) : stream(s), point(k) {}
  Stream& stream;
  uint64_t point;
  bool ready() const override { return stream.completed >= point; }
  void wait() const override {
    ++stream.waits;
    stream.completed = std::max(stream.completed, point);
  }
};

// The newest leaf is the one made last, wherever the expression holds it (the speculative step
// adds in shard order sums measured top down): waiting for it first completes the stream, so
// reading waits once.
TEST(PendingSum, WaitsForTheLeafMadeLastFirst) {
  Stream stream;
  std::vector<PendingSum> made;
  for (uint64_t k = 1; k <= 5; ++k)
    made.push_back(PendingSum::of_partials(partials_of({static_cast<double>(k)}), {1},
                                           Event(std::make_shared<StreamEvent>(stream, k))));
  PendingSum total;
  for (auto it = made.rbegin(); it != made.rend(); ++it) total += *it;  // the newest leftmost
  EXPECT_EQ(total.value(), 15.0);
  EXPECT_EQ(stream.waits, 1);
}

// A step of a large model adds thousands of terms; reading them does not recurse that deep.
TEST(PendingSum, LongRunningTotalReadsWithoutDeepRecursion) {
  PendingSum total;
  double running = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const double term = 1.0 / (i + 1);
    running += term;
    total += PendingSum::of_partials(partials_of({term}), {1}, Event());
  }
  EXPECT_EQ(bits(total.value()), bits(running));
}

// The leaves' memory lives as long as a PendingSum refers to it.
TEST(PendingSum, KeepsItsPartialsAlive) {
  std::weak_ptr<const double> watch;
  PendingSum total;
  {
    std::shared_ptr<const double> partials = partials_of({2.0, 3.0});
    watch = partials;
    total = PendingSum(1.0) + PendingSum::of_partials(std::move(partials), {2}, Event());
  }
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(total.value(), 6.0);
  total = PendingSum();
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace zerone
