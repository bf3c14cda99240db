// Slurm, as torchrun's variables: a task started by `srun` knows its rank
// from SLURM_PROCID, the world from SLURM_NTASKS, its local rank from
// SLURM_LOCALID and the hosts from SLURM_STEP_NODELIST / SLURM_JOB_NODELIST
// / SLURM_NODELIST (compressed: `node[01-04,07],gpu5`). apply_slurm_env
// sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (the
// first host, when unset) and MASTER_PORT (when unset: 29500 + the job id
// mod 1000, so two jobs sharing a node do not collide) from them, so the
// rest of shardfit reads torchrun's variables only. Variables already set
// win: under torchrun inside an allocation, torchrun's are kept.
#pragma once

#include <string>
#include <vector>

namespace shardfit::executor {

// Expands a Slurm hostlist: "node[01-04,07],gpu5" -> node01, node02,
// node03, node04, node07, gpu5 (zero padding kept; several bracket groups
// in one name multiply out). Throws std::invalid_argument naming the text
// when it is malformed (unbalanced brackets, a range running backwards).
std::vector<std::string> expand_hostlist(const std::string& text);

// Sets torchrun's variables from Slurm's when SLURM_PROCID and SLURM_NTASKS
// are set and RANK is not; returns whether it did. Throws
// std::invalid_argument naming the Slurm variable that is malformed.
bool apply_slurm_env();

}  // namespace shardfit::executor
