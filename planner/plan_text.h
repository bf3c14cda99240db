// What `shardfit plan` prints. By default a summary that fits one screen:
// the setup, the best candidate of each strategy family with its memory
// breakdown, and a paragraph saying why the chosen one won, what stops it
// at one more, the runner-up and by how much. `--all` prints every
// candidate's row; a sweep (lists given to --seq-len, --gpus, --nodes or
// --gpu-mem) prints one grid line per point.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "planner/plan_output.h"

namespace shardfit::planner {

// A candidate's strategy family, its id without precision and wrap:
// "zero3+offload+ckpt". The summary shows each family's best.
std::string strategy_family(const Candidate& c);

// The first line: model, seq len, GPUs x profile, memory per GPU and the
// allocator's part of it.
std::string plan_setup_line(const Plan& plan);

// Every candidate (`plan --all`): a header line (model, seq len, GPUs ×
// profile, usable memory), one row per candidate sorted by max batch then
// tokens/s (both descending), the chosen row marked with '*', sizes in GiB
// (MiB when every peak is under 1 GiB). `top` > 0 prints only the first
// `top` rows (and the chosen one, wherever it ranks) and says how many
// were left out.
std::string format_plan_table(const Plan& plan, size_t top = 0);
// The same table as cells: the column titles, then one row per candidate
// (the chosen one marked "*" in the first column), for `report --plan`'s
// HTML and Markdown tables. `left_out` (when given) counts the rows `top`
// left out.
std::vector<std::vector<std::string>> plan_table_cells(const Plan& plan, size_t top = 0, size_t* left_out = nullptr);

// The default: the setup line; each strategy family's best candidate under
// the plan's objective, best first, with peak reserved and the allocated
// peak split into params, grads, optimizer, activations and the rest
// (temporaries, communication buffers, workspaces), host bytes per rank,
// step time and tokens/s; the families where nothing fits batch 1, in one
// line; then explain_choice.
std::string format_plan_summary(const Plan& plan);

// Why the chosen candidate: the objective it won on, what batch+1 runs out
// of and where (PyTorch's out-of-memory figures), the runner-up from
// another family and by how much, and the other objective's winner. Says so
// when nothing fits.
std::string explain_choice(const Plan& plan);

// A sweep's grid: one line per plan (its seq len, GPUs, nodes, memory per
// GPU), the largest batch per GPU each sharding fits (whichever offload,
// checkpointing, precision and wrap fit it), the chosen candidate, its batch
// and tokens/s.
std::string format_sweep_grid(const std::vector<Plan>& plans);

// A sweep's JSON: {"schema": "shardfit.plan-sweep/1", "plans": [plan, ...]},
// each plan as plan_to_json_text writes it. Pretty, trailing newline.
inline constexpr const char kPlanSweepSchema[] = "shardfit.plan-sweep/1";
std::string sweep_to_json_text(const std::vector<Plan>& plans);

}  // namespace shardfit::planner
