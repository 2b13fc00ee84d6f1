// DeepSpeed's offload keys (zero_optimization.offload_optimizer / offload_param, sub_group_size, the
// aio block) fill the offload settings, flags win, and what zerone cannot do is refused by name.
#include <gtest/gtest.h>

#include "tests/test_util.h"
#include "zerone/train/config.h"

namespace zerone::train {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;
using zerone::testing::write_text;
using zerone::testing::write_bytes;

TEST(OffloadConfig, DeepSpeedKeysAreHonoured) {
  TempDir dir;
  write_text(dir.file("ds.json"), R"({
    "zero_optimization": {"stage": 3, "sub_group_size": 12345,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/mnt/nvme", "buffer_count": 5, "pin_memory": true,
                            "pipeline_read": false, "pipeline_write": true, "ratio": 0.25},
      "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 5, "buffer_size": 100000000,
                        "max_in_cpu": 1000000000}},
    "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 2, "single_submit": true,
            "overlap_events": false}})");
  TrainConfig c;
  c.aio_queue_depth = 4;
  c.given.insert("--aio-queue-depth");  // the command line wins
  apply_json_config(dir.file("ds.json"), c);
  EXPECT_EQ(c.zero_stage, 3);
  EXPECT_EQ(c.sub_group_size, 12345);
  EXPECT_EQ(c.offload_optimizer, "nvme");
  EXPECT_EQ(c.nvme_path, "/mnt/nvme");
  EXPECT_EQ(c.offload_buffer_count, 5);
  EXPECT_TRUE(c.pin_memory);
  EXPECT_FALSE(c.pipeline_read);
  EXPECT_TRUE(c.pipeline_write);
  EXPECT_EQ(c.offload_optimizer_ratio, 0.25);
  EXPECT_EQ(c.offload_param, "cpu");
  EXPECT_EQ(c.aio_block_size, 262144);
  EXPECT_EQ(c.aio_queue_depth, 4);
  EXPECT_EQ(c.aio_intra_op_parallelism, 2);  // thread_count, the old name
  EXPECT_TRUE(c.aio_single_submit);
  EXPECT_FALSE(c.aio_overlap_events);
  validate(c);
}

TEST(OffloadConfig, WhatCannotBeDoneIsRefusedByName) {
  TempDir dir;
  write_text(dir.file("ratio.json"), R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": -0.5}}})");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("ratio.json"), c); },
               "offload_optimizer.ratio' is -0.5, expected a number in [0, 1]");
  // A part of nothing offloaded does nothing: an error, named by the key it came from.
  write_text(dir.file("ratio_none.json"), R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none", "ratio": 0.5}}})");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("ratio_none.json"), c); validate(c); },
               "key 'zero_optimization.offload_optimizer.ratio' 0.5 offloads a part of the optimizer, but --offload-optimizer is none");
  // Note [Optimizer state on NVMe and in host memory]: a share of what is not swapped, or of nothing.
  write_text(dir.file("nvme_ratio.json"), R"({"zero_stage": 2, "offload_optimizer": "cpu", "offload_optimizer_nvme_ratio": 0.5})");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("nvme_ratio.json"), c); validate(c); },
               "key 'offload_optimizer_nvme_ratio' 0.5 splits the optimizer state between NVMe and host memory, but "
               "--offload-optimizer is cpu: give --offload-optimizer nvme");
  write_text(dir.file("nvme_ratio_0.json"), R"({"offload_optimizer": "nvme", "offload_optimizer_nvme_ratio": 0})");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("nvme_ratio_0.json"), c); },
               "offload_optimizer_nvme_ratio' is 0, expected a number in (0, 1]");
  write_text(dir.file("unknown.json"), R"({"aio": {"blok_size": 4096}})");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("unknown.json"), c); }, "key 'aio.blok_size' is unknown");
  write_text(dir.file("type.json"), R"({"zero_optimization": {"offload_optimizer": {"buffer_count": "four"}}})");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("type.json"), c); }, "expected an integer");
  auto invalid = [](auto set, const std::string& needle) {
    TrainConfig c;
    c.zero_stage = 3;
    set(c);
    expect_error([&] { validate(c); }, needle);
  };
  invalid([](TrainConfig& c) { c.offload_param = "nvme"; }, "--offload-param nvme needs --nvme-path");
  // Issue 17: DeepSpeed's buffer-pool sizes never block a run, with any device: one notice.
  write_text(dir.file("pbuf.json"),
             R"({"zero_optimization": {"offload_param": {"device": "nvme", "buffer_count": 5, "max_in_cpu": 1e9}}})");
  {
    TrainConfig c;
    apply_json_config(dir.file("pbuf.json"), c);
    ASSERT_EQ(c.notices.size(), 1u);
    EXPECT_NE(c.notices[0].find("zero_optimization.offload_param.max_in_cpu"), std::string::npos) << c.notices[0];
  }
  write_text(dir.file("pbuf2.json"), R"({"zero_optimization": {"offload_param": {"device": "nvme", "buffer_count": -1}}})");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("pbuf2.json"), c); },
               "key 'zero_optimization.offload_param.buffer_count' is -1");
  invalid([](TrainConfig& c) { c.offload_optimizer = "nvme"; }, "--offload-optimizer nvme needs --nvme-path");
  invalid([](TrainConfig& c) { c.offload_buffer_count = 0; }, "--offload-buffer-count 0 is out of range");
  invalid([](TrainConfig& c) { c.aio_queue_depth = 0; }, "--aio-queue-depth 0 is out of range");
  invalid([](TrainConfig& c) { c.device_mem_limit = -1; }, "--device-mem-limit -1 is out of range");
  invalid([](TrainConfig& c) { c.sub_group_size = -1; }, "--sub-group-size -1 is negative");  // 0: auto
}

}  // namespace
}  // namespace zerone::train
