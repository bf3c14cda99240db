// What the engine needs of a Communicator beyond comm.h's collectives,
// whatever the backend and device:
//  - bf16 over gloo (LibTorch 1.13's Gloo has no bfloat16): a decorator
//    that carries the engine's bf16 collectives;
//  - host values (the loss, fp16's overflow flag, the squared gradient norm,
//    report text, --save-on-signal's stop) over nccl, which reduces device
//    tensors only;
//  - NCCL's own buffers set up before a card's memory is capped, so the cap
//    counts them outside the caching allocator, as the planner does.
// comm.h is where the first belongs once comm.cc's gloo backend learns bf16.
#pragma once

#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include "executor/comm.h"

namespace shardfit::executor {

// `world` with bf16 collectives that gloo cannot do (world size > 1)
// carried through fp32 or as bytes; everything else passes straight
// through, and so do the groups it makes. Does not own `world`.
std::unique_ptr<Communicator> with_bf16_over_gloo(Communicator& world);

// All-reduces a host tensor: as is for gloo and loopback; nccl reduces
// device tensors only, so there it goes through a copy on `device` (a few
// bytes of the caching allocator's small pool) and back.
void all_reduce_host(Communicator& comm, const at::Tensor& host, ReduceOp op, c10::Device device);

// --save-on-signal: the stop signal every rank of `world` agrees on after
// a step, from each rank's own (0 = none; a signal may reach one rank
// only): SIGTERM if any rank got one, else SIGINT if any did, else 0. One
// all-reduce of two host flags; the same answer on every rank.
int agree_on_stop_signal(Communicator& world, int mine, c10::Device device);

// One tiny all-reduce on each distinct group (nullptr ones skipped), in the
// given order, on every rank: NCCL sets up its buffers at a communicator's
// first collectives (per connection, lazily, since NCCL 2.22). A no-op
// unless the groups are nccl.
void warm_up_groups(const std::vector<Communicator*>& groups, c10::Device device);

}  // namespace shardfit::executor
