// The executor's communication layer: a Communicator (one rank's view of a
// group of ranks) and the collectives FSDP-style sharding needs on flat
// buffers — all-gather into a flat output, reduce-scatter, all-reduce,
// broadcast, barrier — plus sub-groups for hybrid sharding. Like FSDP2's
// collectives, these are plain calls on buffers the caller owns: they never
// reach back into training state and keep nothing between calls.
//
// Backends:
//   gloo      CPU tensors, through c10d's ProcessGroupGloo; rendezvous over a
//             c10d TCPStore at MASTER_ADDR:MASTER_PORT (hosted by rank 0, or
//             by torchrun's agent).
//   loopback  one process stands in for rank r of a world of N. Collectives
//             are done locally, as if every rank held exactly this rank's
//             inputs; values are what N identical ranks would produce, and
//             shapes and memory are those of rank r. Any device.
//   nccl      CUDA tensors, NCCL on its own streams (executor/nccl_comm.h);
//             built when NCCL and the CUDA runtime are found; run on one card
//             (a world of one, 2026-11-30: reports/gpu/README.md), not yet across GPUs.
//
// Memory: every collective states what it allocates beyond its inputs and
// outputs (collective_extra_memory below, which the planner charges and the
// tests measure). This header is LibTorch-free on purpose (Tensor is only
// forward-declared), so the Torch-free planner can include it for the costs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace at {
class Tensor;
}

namespace shardfit::executor {

enum class Backend { kGloo, kLoopback, kNccl };
const char* backend_name(Backend b);
// "gloo" | "loopback" | "nccl"; anything else throws std::invalid_argument
// naming the value and the choices.
Backend parse_backend(const std::string& name);
// Which tensors a backend reduces: NCCL's CUDA ones, Gloo's CPU ones (the
// loopback, none). Throws std::invalid_argument, one line naming the
// backend and what to use, when `cuda` (the ranks' device) does not match.
void check_backend_device(Backend b, bool cuda);

enum class ReduceOp {
  kSum,
  kAvg,  // sum, then divided by the group size in place (Gloo has no AVG)
};

enum class Collective { kAllGatherInto, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
const char* collective_name(Collective c);

// How the gloo backend implements all_gather_into. c10d 1.13's Gloo has no
// flat all-gather into one tensor: its list all-gather always allocates a
// flat temporary the size of the whole output and copies out of it.
enum class GlooAllGather {
  // Zero out_flat, copy the local shard into its slot, all-reduce(sum) in
  // place. Exact (x + 0 = x), no tensor-allocator bytes: the same memory
  // profile as NCCL's all_gather_into_tensor. Moves 2(N-1)/N x out bytes.
  kViaAllReduce,
  // c10d allgather into views of out_flat. Moves (N-1)/N x out bytes but
  // allocates a temporary of out_flat's size for the duration of the call.
  kViaAllGather,
};

// What a collective allocates beyond its inputs and outputs, transiently
// (live only during the call).
struct CollectiveMemory {
  // Through the tensor allocator of the tensors' device: the meter sees it,
  // and the planner must charge it at the collective.
  int64_t allocator_bytes = 0;
  // Heap scratch inside the communication library (gloo's ring all-reduce
  // keeps two segments of at most 1 MiB each). Not through the tensor
  // allocator: invisible to the meter and not device memory. An upper bound.
  int64_t library_host_bytes_max = 0;
};

// Gloo's ring all-reduce: two segments of at most gloo::AllreduceOptions's
// kMaxSegmentSize (1 MiB), allocated with new[] for each call.
constexpr int64_t kGlooAllReduceScratchBytesMax = 2 * 1024 * 1024;

// `flat_bytes`: the bytes of the whole (unsharded) flat tensor for
// all-gather and reduce-scatter, of the tensor for all-reduce and
// broadcast; ignored for barrier. `world`: the group size.
//
//                   gloo (via all-reduce)  gloo (via allgather)  loopback
//   all_gather_into       0 [+ <=2 MiB]        flat_bytes           0
//   reduce_scatter        0 [+ <=2 MiB]        0 [+ <=2 MiB]        0
//   all_reduce            0 [+ <=2 MiB]        0 [+ <=2 MiB]        0
//   broadcast, barrier    0                    0                    0
// ([...]: library host scratch, not through the tensor allocator; a group
// of one rank does no communication and allocates nothing.)
// nccl: 0 through the caching allocator for all of them; NCCL's own buffers
// are a fixed per-communicator overhead that belongs in the device profile.
inline CollectiveMemory collective_extra_memory(Backend backend, Collective op, int64_t flat_bytes,
                                                int world,
                                                GlooAllGather algo = GlooAllGather::kViaAllReduce) {
  CollectiveMemory m;
  if (backend != Backend::kGloo || world <= 1) return m;
  switch (op) {
    case Collective::kAllGatherInto:
      if (algo == GlooAllGather::kViaAllGather)
        m.allocator_bytes = flat_bytes;
      else
        m.library_host_bytes_max = kGlooAllReduceScratchBytesMax;
      break;
    case Collective::kReduceScatter:
    case Collective::kAllReduce:
      m.library_host_bytes_max = kGlooAllReduceScratchBytesMax;
      break;
    case Collective::kBroadcast:
    case Collective::kBarrier:
      break;
  }
  return m;
}

// A collective failed or timed out, or the rendezvous did. The message is
// one line: the operation, this rank, the peers known to be dead (or that
// none is known), and the library's own error.
class CommError : public std::runtime_error {
 public:
  CommError(const std::string& message, std::string op, std::vector<int> dead_ranks)
      : std::runtime_error(message), op_(std::move(op)), dead_ranks_(std::move(dead_ranks)) {}
  const std::string& op() const { return op_; }
  // Global ranks known to have exited (same-host peers only); empty when
  // none is known (a peer that hangs, or one on another host).
  const std::vector<int>& dead_ranks() const { return dead_ranks_; }

 private:
  std::string op_;
  std::vector<int> dead_ranks_;
};

struct CommOptions {
  Backend backend = Backend::kGloo;
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // torchrun's default
  // Bounds the rendezvous and every collective. Too short and a slow step
  // (a large all-gather on a busy CPU) fails spuriously; too long and a dead
  // peer keeps the survivors waiting that long. torch's store default: 300 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Under torchrun the agent already hosts the store at MASTER_PORT and
  // every rank connects as a client (TORCHELASTIC_USE_AGENT_STORE=True),
  // with keys under /worker/attempt_<restart count>, as torch does.
  bool store_hosted_by_agent = false;
  std::string store_prefix;
  GlooAllGather gloo_all_gather = GlooAllGather::kViaAllReduce;
};

// A collective in flight (Communicator's *_async calls). wait() returns once
// its outputs hold the result, exactly as the synchronous call would have
// left them, or throws the CommError the synchronous call would have thrown.
// Until then the caller keeps its tensors alive and touches none of them.
// Destroying one that was not waited for waits for the library to let go of
// the tensors (bounded by the timeout, errors swallowed) and computes
// nothing: the outputs are then unspecified.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

// One rank's view of a group. Collectives are synchronous: each returns
// when its outputs hold the result (a future CUDA backend: when they may be
// used on the caller's current stream). Every rank of the group must call
// the same collectives in the same order with the same shapes. All tensors
// must be contiguous and of one dtype; flat buffers are 1-D views or any
// contiguous shape (they are treated as flat).
//
// One thread uses a communicator at a time (its pending collectives
// included). Under gloo, rank 0 hosts the
// rendezvous store: it must not exit while others still create groups (end
// a run with barrier()).
//
// A failure or a call that does not complete within the timeout throws
// CommError; the communicator is then broken and every later call throws at
// once. A broken gloo communicator deliberately leaks its threads rather
// than join a worker that may be stuck in the network: exit soon after.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual Backend backend() const = 0;
  // This rank in the group, and the group's size.
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The group's members as ranks of the world communicator, in group order.
  virtual const std::vector<int>& global_ranks() const = 0;

  // out_flat (world_size() x in_shard.numel() elements) := the concatenation
  // of every rank's in_shard, in rank order. Shards must be equal: pad the
  // flat buffer to a multiple of world_size() before cutting it.
  virtual void all_gather_into(const at::Tensor& out_flat, const at::Tensor& in_shard) = 0;
  // out_shard := this rank's slice of the element-wise reduction of every
  // rank's in_flat (world_size() x out_shard.numel() elements). in_flat's
  // contents are unspecified afterwards (gloo reduces it in place: that is
  // how it needs no extra memory).
  virtual void reduce_scatter(const at::Tensor& out_shard, const at::Tensor& in_flat,
                              ReduceOp op) = 0;
  // t := the element-wise reduction of every rank's t, in place.
  virtual void all_reduce(const at::Tensor& t, ReduceOp op) = 0;
  // t := root's t (root is a rank of this group).
  virtual void broadcast(const at::Tensor& t, int root) = 0;

  // reduce_scatter and all_reduce, issued without waiting: the work runs on
  // the library's own threads (gloo: c10d's worker threads) while the caller
  // computes, and completes at the handle's wait(). Overlapping the
  // gradients' reduction with backward (schedule's --async-reduce) is what
  // they are for. No extra memory: the same in-place reduction as the
  // synchronous call. This default runs the synchronous call and returns a
  // handle that has nothing left to wait for (loopback, and nccl today).
  // Calls on one group complete in the order they were issued.
  virtual std::unique_ptr<PendingCollective> reduce_scatter_async(const at::Tensor& out_shard,
                                                                  const at::Tensor& in_flat, ReduceOp op);
  // all_gather_into in flight, for a prefetched gather (--async-gather).
  // gloo: with GlooAllGather::kViaAllReduce only (the allgather algorithm's
  // flat temporary would be allocated on a worker thread, at a moment the
  // meter cannot predict: that one completes before returning).
  virtual std::unique_ptr<PendingCollective> all_gather_into_async(const at::Tensor& out_flat,
                                                                   const at::Tensor& in_shard);
  virtual std::unique_ptr<PendingCollective> all_reduce_async(const at::Tensor& t, ReduceOp op);
  virtual void barrier() = 0;

  // A communicator over `ranks` (ranks of this group, ascending or not: the
  // order given becomes the new group's rank order). Only the members call
  // it, and each member must create its groups in the same order; creation
  // is a rendezvous bounded by the timeout.
  virtual std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) = 0;

 protected:
  Communicator() = default;
};

// Makes the world communicator (rendezvous included for gloo). Throws
// std::invalid_argument for impossible options (rank outside the world, a
// port out of range, nccl in a build without NCCL) and CommError when the rendezvous
// fails or times out (naming the ranks that never arrived).
std::unique_ptr<Communicator> make_communicator(const CommOptions& options);

// A reduce-scatter's result, for backends that reduce the whole flat input:
// this rank's slice of `flat` (out's numel each) copied into `out`; nothing
// to copy when `out` is that slice already.
void keep_rank_slice(const at::Tensor& flat, const at::Tensor& out, int rank);

// Hybrid sharding: ranks are cut into "nodes" of shard_group_size
// consecutive ranks. `shard` is this rank's node; `replicate` holds the
// ranks with this rank's position in every node. E.g. world 4, size 2:
// rank 3 -> shard {2, 3}, replicate {1, 3}. Every rank calls it.
struct HybridGroups {
  std::unique_ptr<Communicator> shard;
  std::unique_ptr<Communicator> replicate;
};
// Throws std::invalid_argument when shard_group_size does not divide the
// world (the error shows the arithmetic).
HybridGroups make_hybrid_groups(Communicator& world, int shard_group_size);

}  // namespace shardfit::executor
