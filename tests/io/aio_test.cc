// The swap I/O layer (io/aio.h): every aio setting moves the bytes it is asked to, faults surface
// as errors naming the file and the operation, swap directories come and go with their owner.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <random>

#include "tests/test_util.h"
#include "zerone/core/memory.h"
#include "zerone/io/aio.h"

namespace zerone::io {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;

bool exists(const std::string& path) {
  struct stat sb;
  return ::stat(path.c_str(), &sb) == 0;
}

// Writes a pattern in several transfers, reads it back into another buffer, compares.
void round_trip(SwapIo& io, SwapDirectory& dir, const std::string& name) {
  const size_t bytes = 3 * 1024 * 1024 + 8192;  // not a multiple of the block size
  FileDescriptor fd = dir.create_file(name, 2 * bytes);
  Buffer out(bytes, MemCategory::swap, MemPlace::host, 4096), in(bytes, MemCategory::swap, MemPlace::host, 4096);
  std::mt19937 rng(7);
  for (size_t i = 0; i < bytes / 4; ++i) out.as<uint32_t>()[i] = rng();
  const std::string path = dir.path() + "/" + name;
  SwapIo::Ticket w1 = io.start(IoOp::write, fd.get(), path, out.data(), bytes, 0);
  SwapIo::Ticket w2 = io.start(IoOp::write, fd.get(), path, out.data(), bytes, bytes);
  io.wait(w2);
  io.wait(w1);
  io.wait(io.start(IoOp::read, fd.get(), path, in.data(), bytes, bytes));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), bytes), 0);
  std::memset(in.data(), 0, bytes);
  io.wait(io.start(IoOp::read, fd.get(), path, in.data(), bytes, 0));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), bytes), 0);
}

TEST(SwapIo, EverySettingMovesTheBytes) {
  TempDir tmp;
  SwapDirectory dir(tmp.path(), 0, "--nvme-path");
  int k = 0;
  for (size_t block : {size_t{4096}, size_t{1} << 20})
    for (int depth : {1, 8})
      for (int rings : {1, 3})
        for (bool single : {false, true})
          for (bool overlap : {false, true}) {
            AioConfig c;
            c.block_bytes = block;
            c.queue_depth = depth;
            c.intra_op_parallelism = rings;
            c.single_submit = single;
            c.overlap_events = overlap;
            auto io = make_uring_io(c);
            SCOPED_TRACE(::testing::Message() << "block " << block << " depth " << depth << " rings " << rings
                                            << " single " << single << " overlap " << overlap);
            round_trip(*io, dir, "f" + std::to_string(k++ % 8));
          }
}

TEST(SwapIo, FaultsNameTheFileAndOperation) {
  TempDir tmp;
  SwapDirectory dir(tmp.path(), 3, "--nvme-path");
  FileDescriptor fd = dir.create_file("x.swp", 1 << 20);
  const std::string path = dir.path() + "/x.swp";
  Buffer buf(1 << 16, MemCategory::swap, MemPlace::host, 4096);
  auto faulty = [&](const std::string& plan) { return make_fault_injecting_io(make_uring_io(AioConfig()), parse_fault_plan(plan)); };
  {
    auto io = faulty("write:enospc:1");
    io->wait(io->start(IoOp::write, fd.get(), path, buf.data(), buf.bytes(), 0));  // the 0th passes
    expect_error([&] { io->wait(io->start(IoOp::write, fd.get(), path, buf.data(), buf.bytes(), 0)); },
                 "write of swap file '" + path + "' at offset 0 (65536 bytes) failed: No space left on device");
  }
  {
    auto io = faulty("read:eio:0");
    expect_error([&] { io->wait(io->start(IoOp::read, fd.get(), path, buf.data(), buf.bytes(), 4096)); },
                 "read of swap file '" + path + "' at offset 4096 (65536 bytes) failed: Input/output error");
  }
  {
    auto io = faulty("read:short:0");
    expect_error([&] { io->wait(io->start(IoOp::read, fd.get(), path, buf.data(), buf.bytes(), 0)); },
                 "was short: 61440 of 65536 bytes");
  }
  {
    // A real short read: past the end of the file.
    auto io = make_uring_io(AioConfig());
    expect_error([&] { io->wait(io->start(IoOp::read, fd.get(), path, buf.data(), buf.bytes(), (1 << 20) - 4096)); },
                 "read of swap file '" + path + "' at offset 1044480 was short: 4096 of 65536 bytes");
  }
  {
    auto io = faulty("write:delete:0");
    expect_error([&] { io->wait(io->start(IoOp::write, fd.get(), path, buf.data(), buf.bytes(), 0)); },
                 "write of swap file '" + path + "': the file was deleted during the run");
  }
  expect_error([] { parse_fault_plan("write:melt:1"); }, "KIND must be enospc, eio, short or delete");
}

TEST(SwapDirectory, RemovedWithItsFilesAndRefusesBadPaths) {
  TempDir tmp;
  std::string made;
  {
    SwapDirectory dir(tmp.path(), 1, "--nvme-path");
    made = dir.path();
    FileDescriptor fd = dir.create_file("a.swp", 8192);
    EXPECT_TRUE(exists(made + "/a.swp"));
  }
  EXPECT_FALSE(exists(made));
  expect_error([&] { SwapDirectory d(tmp.path() + "/missing", 0, "--nvme-path"); }, "No such file or directory");
  expect_error([&] { SwapDirectory d("/dev/shm", 0, "--nvme-path"); }, "is on tmpfs/ramfs, which is memory");
  AioConfig bad;
  bad.queue_depth = 0;
  expect_error([&] { validate(bad); }, "aio.queue_depth 0 is out of range");
}

}  // namespace
}  // namespace zerone::io
