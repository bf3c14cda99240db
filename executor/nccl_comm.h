// The nccl backend: a Communicator for CUDA tensors that calls the NCCL API
// directly (no c10d ProcessGroupNCCL, so it compiles against a CPU-only
// LibTorch too: CI builds it wherever nccl.h and libcudart are found).
//
// Rendezvous: through the same c10d TCPStore as the gloo backend
// (MASTER_ADDR:MASTER_PORT, hosted by rank 0 or torchrun's agent). Each
// group's first member makes an ncclUniqueId and publishes it in the store;
// the members wait for each other there (a missing rank is named after the
// timeout), then ncclCommInitRankConfig in nonblocking mode, polled, so the
// NCCL handshake is bounded by the timeout too. Sub-groups get a new unique
// id rather than ncclCommSplit: a split is collective over the *parent*
// group, and the Communicator contract lets only the members create a group.
//
// Streams (FSDP2's design): every collective runs on the communicator's own
// high-priority stream. Before it, that stream waits for an event recorded
// on the caller's compute stream (so the inputs are ready); after it, an
// event is recorded. The synchronous Communicator calls make the compute
// stream wait for that event and return without blocking the host. The
// compute stream is torch's current stream for the device when LibTorch has
// CUDA, else the legacy default stream.
//
// Buffer lifetime (no recordStream, FSDP2's lesson: recordStream lets the
// caching allocator hold a freed block until an unknown later point, which
// inflates reserved memory unpredictably):
//   - synchronous calls: inputs and outputs may be freed as soon as the call
//     returns, provided they were allocated on, and are only used again from,
//     the compute stream. The caching allocator reuses a block in that
//     stream's order, and everything enqueued there after the call runs
//     after the collective.
//   - asynchronous calls (NcclCommunicator::*_async): the returned NcclWork
//     keeps references to the tensors until wait(); until then the caller
//     must not write the inputs or read the outputs. wait() makes the
//     current compute stream wait for the collective; a work destroyed
//     without wait() waits then.
//   - anything used from another stream or from the host must first wait
//     for the collective (NcclWork::synchronize, NcclCommunicator::synchronize).
//
// Rate limit (FSDP's limit_all_gathers): at most max_in_flight_all_gathers
// (2) all-gathers may be issued and not yet finished on the GPU; issuing
// another blocks the host until the oldest finishes (bounded by the
// timeout). It keeps a CPU thread that runs ahead from issuing the whole
// model's all-gathers, each with its unsharded output held by the caller.
//
// Failure: a watchdog thread per communicator polls ncclCommGetAsyncError and
// the age of the oldest unfinished collective. An NCCL error, or a
// collective not finished within the timeout (measured from when it was
// issued, as torch's ProcessGroupNCCL does), breaks the communicator: it
// calls ncclCommAbort (the stuck kernels return), and every later call
// throws CommError naming the operation, this rank and the same-host peers
// that exited. A host thread blocked elsewhere (a CUDA synchronize on the
// compute stream) cannot see that, so by default the watchdog ends the
// process with exit code 3 (SPEC: the environment failed) after one line on
// stderr, unless a call on this communicator reported the failure first.
//
// Memory (collective_extra_memory in comm.h charges the same):
//   - through the caching allocator: nothing, for every collective. NCCL
//     reads and writes the caller's buffers in place (all-gather into the
//     flat output, reduce-scatter from the flat input, all-reduce and
//     broadcast in place); the rate limit bounds how many all-gather
//     outputs the caller has alive at once, not what this backend allocates.
//   - outside the caching allocator (invisible to allocated and reserved,
//     but on the card): NCCL's own buffers, per communicator and per peer
//     connection, per channel and protocol (NCCL_BUFFSIZE, 4 MiB by default,
//     for the Simple protocol; smaller ones for LL and LL128), set up at init
//     and, since NCCL 2.22, lazily at a connection's first use. They depend
//     on the topology and NCCL's version, so shardfit does not compute them:
//     the device profile's overheads_bytes.nccl_buffers holds them (charged
//     once per rank when the world has more than one rank), and tests/gpu
//     measures them on a real card. Plus the barrier's device scalar (one
//     4-byte cudaMalloc at the first barrier) and the stream and events
//     (driver memory).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "executor/comm.h"

// CUDA's handle types, so this header needs no CUDA include.
struct CUstream_st;
struct CUevent_st;

namespace shardfit::executor {

// ---- documented memory costs (the tests check these) -----------------------

// Bytes the nccl backend allocates through the caching allocator for one
// collective, of any kind and size.
constexpr int64_t kNcclCachingAllocatorBytesPerCollective = 0;
// The barrier's all-reduce operand: one float, cudaMalloc'ed once per
// communicator at its first barrier (outside the caching allocator; the
// driver packs small allocations into pages it already has).
constexpr int64_t kNcclBarrierScalarBytes = 4;
// NCCL_BUFFSIZE's default, NCCL's buffer for the Simple protocol per channel
// and peer connection (NCCL's environment-variable documentation). An order
// of magnitude for the profile's nccl_buffers, not a bound.
constexpr int64_t kNcclDefaultBuffSizeBytes = int64_t{4} << 20;
// FSDP's limit_all_gathers: two all-gathers in flight.
constexpr int kNcclDefaultMaxInFlightAllGathers = 2;

struct NcclOptions {
  // This rank's CUDA device. -1: LOCAL_RANK when set (torchrun, --nproc),
  // else the global rank modulo the visible devices: one GPU per rank.
  int device = -1;
  // All-gathers issued and not finished on the GPU before issuing another
  // blocks the host. 0: no limit.
  int max_in_flight_all_gathers = kNcclDefaultMaxInFlightAllGathers;
  // On a failure the watchdog found and no call reported within
  // exit_grace, end the process with exit code 3. Tests turn it off.
  bool exit_process_on_failure = true;
  std::chrono::milliseconds exit_grace{std::chrono::seconds(2)};
  // How often the watchdog polls NCCL and the in-flight collectives.
  std::chrono::milliseconds watchdog_period{100};
};

// One issued collective. Move-only.
class NcclWork {
 public:
  struct Impl;
  NcclWork();
  explicit NcclWork(std::unique_ptr<Impl> impl);
  NcclWork(NcclWork&&) noexcept;
  NcclWork& operator=(NcclWork&&) noexcept;
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  // Waits (as wait()) if not waited yet.
  ~NcclWork();

  // True once the collective has finished on the GPU (or for an empty work).
  bool completed() const;
  // The current compute stream waits for the collective; the host does not.
  // Releases the tensors the work kept alive. Idempotent.
  void wait();
  // The host waits for the collective, bounded by the communicator's
  // timeout; throws CommError when it fails or times out. Then as wait().
  void synchronize();

 private:
  std::unique_ptr<Impl> impl_;
};

// The nccl Communicator, with asynchronous variants of the collectives for
// overlap (prefetching the next unit's all-gather while this one computes).
// The synchronous Communicator calls are `*_work(...).wait()` (`*_async` for
// broadcast); the Communicator-level `*_async` calls return a
// PendingCollective whose wait() is the work's wait(), the compute stream's.
class NcclCommunicator : public Communicator {
 public:
  virtual NcclWork all_gather_into_work(const at::Tensor& out_flat, const at::Tensor& in_shard) = 0;
  virtual NcclWork reduce_scatter_work(const at::Tensor& out_shard, const at::Tensor& in_flat,
                                       ReduceOp op) = 0;
  virtual NcclWork all_reduce_work(const at::Tensor& t, ReduceOp op) = 0;
  virtual NcclWork broadcast_async(const at::Tensor& t, int root) = 0;

  // The host waits for every collective issued so far (bounded by the
  // timeout; throws CommError).
  virtual void synchronize() = 0;
  // All-gathers issued and not yet finished on the GPU (after retiring the
  // finished ones): at most max_in_flight_all_gathers.
  virtual int in_flight_all_gathers() = 0;
  virtual int device() const = 0;
  // The communicator's own stream (cudaStream_t).
  virtual CUstream_st* stream() const = 0;
};

// Makes the world communicator over NCCL. Throws std::invalid_argument for
// impossible options (no CUDA device visible, a device index past the
// visible ones) and CommError when the rendezvous or NCCL's initialisation
// fails or times out. make_communicator(Backend::kNccl) calls it with the
// default NcclOptions.
std::unique_ptr<NcclCommunicator> make_nccl_communicator(const CommOptions& options,
                                                         const NcclOptions& nccl = {});

// "NCCL 2.28.9 (headers 2.28.9)": the library loaded at run time and the
// headers compiled against.
std::string nccl_version_string();

// Visible CUDA devices; 0 when there is none or no driver (never throws).
// `why` (optional) receives the CUDA runtime's reason when there is none.
int cuda_device_count(std::string* why = nullptr);

}  // namespace shardfit::executor
