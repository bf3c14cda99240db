// Training checkpoints: what `shardfit run --save DIR / --resume DIR` keeps,
// on top of the sharded checkpoint format (executor/checkpoint.h).
//
// Each rank saves exactly the state it owns, so a save costs no gathering:
//   "<unit>/master"      its fp32 master of every unit, in wrap order: the
//                        shard (zero2/zero3/hybrid), its slice (zero1) or
//                        the whole flat parameter (ddp; shard group of 1)
//   "<unit>/exp_avg",    AdamW's state of that master, once a step ran
//   "<unit>/exp_avg_sq"
//   "rng/cpu"            the CPU generator's state (dropout masks go on as
//                        they would have; the data is addressed by step and
//                        needs no state), and "rng/cuda", the rank's GPU
//                        generator, when the units compute on CUDA
// and the scalars in the metadata: the step, AdamW's step count, fp16's loss
// scaler, plus the job it came from (model, candidate, batch, ...).
//
// Together these are everything a step reads that is not rebuilt from the
// options: a run resumed from step k takes the same steps k+1.. with the
// same losses, bit for bit, as the run that never stopped (same world size,
// strategy and batch; tests/executor_checkpoint checks it through the CLI).
//
// Layout of a --save root: DIR/step-000005/, DIR/step-000010/, ... each a
// committed checkpoint once its manifest.json exists.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/checkpoint.h"
#include "executor/comm.h"
#include "executor/flat_param.h"

namespace shardfit::executor {

struct CheckpointOptions {
  std::string save_dir;     // --save: a root directory; "" = no saves
  int64_t save_every = 0;   // --save-every: also after every N-th step; 0 = only after the last
  std::string resume_from;  // --resume: a committed checkpoint, or a --save root (its latest)
};

// The scalars a resumed run continues from.
struct TrainingProgress {
  int64_t step = 0;             // the last completed step (steps count from 1)
  int64_t optimizer_steps = 0;  // AdamW's step count (fp16 overflow steps are skipped)
  int64_t skipped_steps = 0;    // fp16: steps skipped on overflow so far
  double loss_scale = 0;        // fp16: the dynamic loss scale; 0 otherwise
  int64_t loss_scale_good_steps = 0;
};

// DIR/step-000042
std::filesystem::path step_checkpoint_dir(const std::filesystem::path& root, int64_t step);

// --resume's argument: a committed checkpoint directory as is; a --save root
// resolves to its latest committed step-* directory. Throws
// std::invalid_argument, one line naming the path, when there is none.
std::filesystem::path resolve_resume_dir(const std::filesystem::path& path);

// Every rank calls it with its units (wrap order); rank 0 commits the
// checkpoint (manifest.json) once every rank has written its file, and no
// rank returns before the checkpoint is committed. `job` is stored in the
// metadata for humans and for resume's checks. Host memory only: nothing is
// charged to the device meter.
void save_training_checkpoint(const std::filesystem::path& dir, Communicator& world,
                              const std::vector<FlatParam*>& units, const TrainingProgress& progress,
                              const nlohmann::json& job);

// What killed saves leave behind in a --save root, removed by rank 0 right
// after it commits step `committed` (so never a save in progress): step-*
// directories below `committed` that have no manifest.json, and stray
// `*.tmp.*` files in the step directories up to it. Returns how many
// entries it removed; errors are logged, never thrown (a save succeeded).
int remove_checkpoint_litter(const std::filesystem::path& root, int64_t committed);

// Loads this rank's file into its units' masters and AdamW state (created
// where the optimizer would have created them), restores the CPU
// generator, and publishes the masters (zero1 all-gathers over
// `optimizer_group`, the world). Throws std::invalid_argument naming the
// file when the checkpoint is of another model, wrap policy, sharding or
// world size.
TrainingProgress load_training_checkpoint(const std::filesystem::path& dir, Communicator& world,
                                          Communicator& optimizer_group,
                                          const std::vector<FlatParam*>& units);

}  // namespace shardfit::executor
