// W4: throughput of zerone's NVMe swap I/O (io/aio.h, io_uring + O_DIRECT) on the disk under DIR,
// moving a file the way the optimizer swap does: transfers of one sub-group (MiB) each, `inflight`
// of them at once, sequential through the file, written then read back.
//   bench_swap DIR [file_MiB=2048] [transfer_MiB=64] [inflight=2] [block_KiB=1024] [queue_depth=8]
// Prints "write MB/s" and "read MB/s" (10^6 bytes) for comparison with fio on the same directory.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/io/aio.h"

int main(int argc, char** argv) {
  using namespace zerone;
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_swap DIR [file_MiB] [transfer_MiB] [inflight] [block_KiB] [queue_depth]\n");
    return 2;
  }
  auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const size_t mib = 1 << 20;
  const size_t file_bytes = static_cast<size_t>(arg(2, 2048)) * mib, transfer = static_cast<size_t>(arg(3, 64)) * mib;
  const int inflight = static_cast<int>(arg(4, 2));
  io::AioConfig aio;
  aio.block_bytes = static_cast<size_t>(arg(5, 1024)) * 1024;
  aio.queue_depth = static_cast<int>(arg(6, 8));
  try {
    io::SwapDirectory dir(argv[1], 0, "DIR");
    io::FileDescriptor fd = dir.create_file("bench.swp", file_bytes);
    const std::string path = dir.path() + "/bench.swp";
    auto io = io::make_uring_io(aio);
    std::vector<Buffer> buffers;
    for (int i = 0; i < inflight; ++i) {
      buffers.emplace_back(transfer, MemCategory::swap, MemPlace::host, 4096);
      std::memset(buffers.back().data(), 0x5a + i, transfer);
    }
    for (io::IoOp op : {io::IoOp::write, io::IoOp::read}) {
      std::vector<io::SwapIo::Ticket> tickets(inflight, 0);
      auto t0 = std::chrono::steady_clock::now();
      size_t k = 0;
      for (size_t off = 0; off + transfer <= file_bytes; off += transfer, ++k) {
        auto& t = tickets[k % inflight];
        if (t != 0) io->wait(t);
        t = io->start(op, fd.get(), path, buffers[k % inflight].data(), transfer, off);
      }
      for (auto t : tickets)
        if (t != 0) io->wait(t);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s MB/s %.0f\n", io::io_op_name(op), static_cast<double>(k * transfer) / s / 1e6);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_swap: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
