#include "planner/plan_text.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "planner/profile.h"

namespace shardfit::planner {
namespace {

// `v` printed with the printf format `fmt`.
std::string number(const char* fmt, double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}
std::string format_seconds(double s) { return number("%.4g", s); }
std::string format_count(double x) { return number("%.0f", x); }
std::string size_number(int64_t bytes, double unit) { return number("%.2f", static_cast<double>(bytes) / unit); }
std::string percent(double x) { return number("%.1f%%", x); }

// Columns padded to their widest cell, numbers right-aligned so they line
// up by magnitude, two spaces between columns, no trailing blanks.
std::string render(const std::vector<std::vector<std::string>>& cells, const std::vector<bool>& right) {
  std::vector<size_t> width(right.size(), 0);
  for (const auto& row : cells)
    for (size_t k = 0; k < row.size(); ++k) width[k] = std::max(width[k], row[k].size());
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (size_t k = 0; k < row.size(); ++k) {
      std::string pad(width[k] - row[k].size(), ' ');
      if (k) line += "  ";
      line += right[k] ? pad + row[k] : row[k] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// GiB, or MiB when every peak shown is under 1 GiB: one unit per table.
struct Unit {
  double bytes;
  std::string name;
};
Unit unit_for(const std::vector<const PlanCandidate*>& rows) {
  bool small = true;
  for (const PlanCandidate* c : rows) small = small && c->predicted.peak_reserved_bytes < (int64_t{1} << 30);
  return small ? Unit{1024.0 * 1024, "MiB"} : Unit{1024.0 * 1024 * 1024, "GiB"};
}

std::string tokens_cell(const PlanCandidate& c) {
  return c.max_batch_per_gpu > 0 && c.predicted.tokens_per_s > 0 ? format_count(c.predicted.tokens_per_s) : "-";
}
std::string step_cell(const PlanCandidate& c) {
  return c.max_batch_per_gpu > 0 && c.predicted.step_time_s > 0 ? format_seconds(c.predicted.step_time_s) : "-";
}

// Candidates in the objective's order, best first, those that fit no batch
// last (ties keep the plan's order).
std::vector<const PlanCandidate*> by_objective(std::vector<const PlanCandidate*> rows, Objective objective) {
  std::stable_sort(rows.begin(), rows.end(), [objective](const PlanCandidate* a, const PlanCandidate* b) {
    if ((a->max_batch_per_gpu > 0) != (b->max_batch_per_gpu > 0)) return a->max_batch_per_gpu > 0;
    return a->max_batch_per_gpu > 0 && ranks_above(*a, *b, objective);
  });
  return rows;
}

// The best fitting candidate among `rows` under `objective`, or nullptr.
const PlanCandidate* best_of(const std::vector<const PlanCandidate*>& rows, Objective objective) {
  const PlanCandidate* best = nullptr;
  for (const PlanCandidate* c : rows)
    if (c->max_batch_per_gpu > 0 && (!best || ranks_above(*c, *best, objective))) best = c;
  return best;
}

// The allocator's budget, what a batch's reserved bytes are held against.
int64_t allocator_budget(const PlanHardware& hw) {
  return hw.allocator_budget_bytes > 0 ? hw.allocator_budget_bytes : hw.device_mem_bytes;
}

// "batch 215 runs out of memory in step2/backward/root (activations): ..."
std::string limit_sentence(const Plan& plan, const PlanCandidate& c) {
  if (!c.oom) {
    if (c.limit.empty()) return "";
    return "Batch " + std::to_string(c.max_batch_per_gpu + 1) + " is limited by " + c.limit + ".";
  }
  const PlanCandidate::Oom& o = *c.oom;
  std::string s = "Batch " + std::to_string(o.batch) + " runs out of memory (" + c.limit + "): it asks for " +
                  format_size(o.allocation_bytes) + " with " + format_size(o.allocated_bytes) + " allocated and " +
                  format_size(o.reserved_bytes) + " reserved";
  const int64_t budget = allocator_budget(plan.hardware);
  if (budget > 0) s += " of the allocator's " + format_size(budget);
  return s + ".";
}

std::string versus(const PlanCandidate& winner, const PlanCandidate& other) {
  const double w = winner.predicted.tokens_per_s;
  const double o = other.predicted.tokens_per_s;
  std::string speed = w > 0 && o > 0 && o != w
                          ? percent(100.0 * std::abs(w - o) / w) + (o < w ? " fewer" : " more") + " tokens/s (" +
                                format_count(o) + ")"
                          : "the same tokens/s";
  return speed + " at batch " + std::to_string(other.max_batch_per_gpu) + " per GPU";
}

}  // namespace

std::string strategy_family(const Candidate& c) {
  std::string f = sharding_name(c.sharding);
  if (c.offload) f += "+offload";
  if (c.recompute) f += "+ckpt";
  return f;
}

// The header's attention: nothing for eager, and for sdpa (on a CPU profile
// eager everywhere: nothing) the kernel each precision's candidates run.
static std::string attention_text(const Plan& plan) {
  if (plan.model.attention == "eager") return "";
  if (plan.model.attention != "sdpa") return ", attention " + plan.model.attention;
  std::map<std::string, std::vector<std::string>> precisions_of;  // kernel -> precisions
  for (const PlanCandidate& c : plan.candidates) {
    std::vector<std::string>& p = precisions_of[c.attention.empty() ? "eager" : c.attention];
    const std::string name = precision_name(c.candidate.precision);
    if (std::find(p.begin(), p.end(), name) == p.end()) p.push_back(name);
  }
  if (precisions_of.empty() || (precisions_of.size() == 1 && precisions_of.count("eager"))) return "";
  std::string out = ", attention sdpa:";
  for (const auto& [kernel, precisions] : precisions_of) {
    out += (out.back() == ':' ? " " : ", ") + kernel + " (";
    for (size_t i = 0; i < precisions.size(); ++i) out += (i ? ", " : "") + precisions[i];
    out += ")";
  }
  return out;
}

std::string plan_setup_line(const Plan& plan) {
  std::ostringstream out;
  const PlanHardware& hw = plan.hardware;
  if (plan.stack != "shardfit")
    out << "stack " << plan.stack
        << (plan.ddp_bucket_view && plan.ddp_static_graph ? " (DDP gradient_as_bucket_view, static_graph)"
            : plan.ddp_bucket_view                        ? " (DDP gradient_as_bucket_view)"
            : plan.ddp_static_graph                       ? " (DDP static_graph)"
                                                          : " (DDP defaults)")
        << (plan.pytorch_job && plan.pytorch_job->fsdp_version == 2 ? " (FSDP2 fully_shard)" : "") << ": ";
  out << plan.model.name << ", seq len " << plan.model.seq_len << ", loss " << plan.model.loss
      << attention_text(plan)
      << (plan.schedule.prefetch == 1 ? "" : ", prefetch " + std::to_string(plan.schedule.prefetch))
      << (plan.schedule.async_reduce ? ", async reduce" : "") << (plan.schedule.async_gather ? ", async gather" : "")
      << ", " << hw.world_size() << " GPU" << (hw.world_size() == 1 ? "" : "s") << " x " << hw.profile;
  if (hw.nodes > 1) out << " (" << hw.nodes << " nodes x " << hw.gpus_per_node << ")";
  out << (hw.allocator_budget_bytes > 0 ? ", memory " : ", usable memory ")
      << (hw.device_mem_bytes > 0 ? format_size(hw.device_mem_bytes) : std::string("unlimited")) << " per GPU";
  if (hw.allocator_budget_bytes > 0)
    out << ", " << format_size(hw.allocator_budget_bytes)
        << " of it the allocator's (the rest the profile's fixed overheads)";
  out << "\n";
  return out.str();
}

std::vector<std::vector<std::string>> plan_table_cells(const Plan& plan, size_t top, size_t* left_out) {
  std::vector<const PlanCandidate*> rows;
  for (const PlanCandidate& c : plan.candidates) rows.push_back(&c);
  std::stable_sort(rows.begin(), rows.end(), [](const PlanCandidate* a, const PlanCandidate* b) {
    if (a->max_batch_per_gpu != b->max_batch_per_gpu) return a->max_batch_per_gpu > b->max_batch_per_gpu;
    return a->predicted.tokens_per_s > b->predicted.tokens_per_s;
  });
  if (left_out) *left_out = 0;
  if (top > 0 && rows.size() > top) {
    std::vector<const PlanCandidate*> kept(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(top));
    for (size_t i = top; i < rows.size(); ++i)
      if (rows[i]->id() == plan.chosen) kept.push_back(rows[i]);
    if (left_out) *left_out = rows.size() - kept.size();
    rows = kept;
  }
  const Unit unit = unit_for(rows);
  std::vector<std::vector<std::string>> cells = {{"", "candidate", "max batch/GPU", "reserved " + unit.name,
                                                  "allocated " + unit.name, "limit", "step s", "tokens/s"}};
  for (const PlanCandidate* c : rows)
    cells.push_back({c->id() == plan.chosen ? "*" : "", c->id(), std::to_string(c->max_batch_per_gpu),
                     size_number(c->predicted.peak_reserved_bytes, unit.bytes),
                     size_number(c->predicted.peak_allocated_bytes, unit.bytes), c->limit.empty() ? "-" : c->limit,
                     step_cell(*c), tokens_cell(*c)});
  return cells;
}

std::string format_plan_table(const Plan& plan, size_t top) {
  size_t left_out = 0;
  const auto cells = plan_table_cells(plan, top, &left_out);
  std::string out = plan_setup_line(plan) + render(cells, {false, false, true, true, true, false, true, true});
  if (left_out > 0)
    out += "... " + std::to_string(left_out) + " more candidate" + (left_out == 1 ? "" : "s") +
           " (--top 0 shows all)\n";
  if (plan.chosen.empty())
    out += "no candidate fits batch 1 on this device\n";
  else
    out += "* chosen: " + plan.chosen + " (objective: " + objective_name(plan.objective) + ")\n";
  return out;
}

namespace {

// What a GPU holds outside the allocator (the CUDA context, NCCL's buffers):
// --gpu-mem less the allocator's budget.
int64_t outside_allocator_bytes(const PlanHardware& hw) {
  return hw.allocator_budget_bytes > 0 ? hw.device_mem_bytes - hw.allocator_budget_bytes : 0;
}

}  // namespace

std::string format_plan_summary(const Plan& plan) {
  // Each family's best, and the families where nothing fits batch 1.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const PlanCandidate*>> families;
  for (const PlanCandidate& c : plan.candidates) {
    const std::string f = strategy_family(c.candidate);
    if (!families.count(f)) order.push_back(f);
    families[f].push_back(&c);
  }
  std::vector<const PlanCandidate*> rows;
  std::vector<std::string> unfit;
  const PlanCandidate* least_unfit = nullptr;  // the one whose batch 1 needs least
  const PlanCandidate* chosen = plan.find(plan.chosen);
  for (const std::string& f : order) {
    if (const PlanCandidate* best = best_of(families[f], plan.objective)) {
      rows.push_back(chosen && strategy_family(chosen->candidate) == f ? chosen : best);
      continue;
    }
    unfit.push_back(f);
    for (const PlanCandidate* c : families[f])
      if (!least_unfit || c->predicted.peak_reserved_bytes < least_unfit->predicted.peak_reserved_bytes)
        least_unfit = c;
  }
  rows = by_objective(rows, plan.objective);
  const Unit unit = unit_for(rows);
  std::vector<std::vector<std::string>> cells = {{"", "best of each strategy", "batch/GPU", "reserved", "params",
                                                  "grads", "optim", "activ", "other", "host", "step s",
                                                  "tokens/s"}};
  for (const PlanCandidate* c : rows) {
    const MemoryBreakdown& b = c->predicted.breakdown;
    cells.push_back({c->id() == plan.chosen ? "*" : "", c->id(), std::to_string(c->max_batch_per_gpu),
                     size_number(c->predicted.peak_reserved_bytes, unit.bytes),
                     size_number(b.params_bytes, unit.bytes), size_number(b.grads_bytes, unit.bytes),
                     size_number(b.optimizer_bytes, unit.bytes), size_number(b.activations_bytes, unit.bytes),
                     size_number(b.temporaries_bytes + b.comm_buffers_bytes + b.overhead_bytes, unit.bytes),
                     size_number(c->predicted.peak_host_bytes, unit.bytes), step_cell(*c), tokens_cell(*c)});
  }
  std::string out = plan_setup_line(plan);
  if (rows.empty()) {
    out += "no candidate fits batch 1 on this device\n";
  } else {
    out += render(cells, {false, false, true, true, true, true, true, true, true, true, true, true});
    out += "   " + unit.name + " per GPU at the peak: reserved, then allocated by class (other: temporaries, " +
           "comm buffers, workspaces); host: per rank\n";
  }
  if (!unfit.empty()) {
    out += "nothing fits batch 1 with";
    for (size_t i = 0; i < unfit.size(); ++i) out += (i ? ", " : " ") + unfit[i];
    if (least_unfit)
      out += " (the least, " + least_unfit->id() + ", fits batch 1 in " +
             format_size(least_unfit->predicted.peak_reserved_bytes + outside_allocator_bytes(plan.hardware)) +
             " per GPU)";
    out += "\n";
  }
  out += explain_choice(plan);
  size_t none_fit = 0;
  for (const PlanCandidate& c : plan.candidates) none_fit += c.max_batch_per_gpu < 1;
  out += "--all lists all " + std::to_string(plan.candidates.size()) + " candidates" +
         (none_fit ? " (" + std::to_string(none_fit) + " fit no batch)" : "") + "; --json and --out write every one\n";
  return out;
}

std::string explain_choice(const Plan& plan) {
  const PlanCandidate* chosen = plan.find(plan.chosen);
  if (!chosen) return "";
  const bool by_speed = plan.objective == Objective::kThroughput;
  std::string out = "why: " + chosen->id() + (by_speed ? " is the fastest that fits" : " fits the largest batch") +
                    " (--objective " + objective_name(plan.objective) + "): ";
  out += by_speed ? format_count(chosen->predicted.tokens_per_s) + " tokens/s at batch " +
                        std::to_string(chosen->max_batch_per_gpu) + " per GPU"
                  : std::to_string(chosen->max_batch_per_gpu) + " per GPU at " +
                        format_count(chosen->predicted.tokens_per_s) + " tokens/s";
  out += ".\n";
  if (const std::string limit = limit_sentence(plan, *chosen); !limit.empty()) out += "  " + limit + "\n";
  // A bf16 choice tied with its fp16 twin: why bf16 (choose's tie-break).
  if (chosen->candidate.precision == Precision::kBf16) {
    Candidate twin = chosen->candidate;
    twin.precision = Precision::kFp16;
    const PlanCandidate* t = plan.find(twin.to_id());
    if (t && t->max_batch_per_gpu == chosen->max_batch_per_gpu &&
        t->predicted.tokens_per_s == chosen->predicted.tokens_per_s)
      out += "  bf16 over fp16 at the same batch and speed: bf16 needs no loss scaling.\n";
  }
  // The runner-up from another family, and the other objective's winner.
  std::vector<const PlanCandidate*> others;
  for (const PlanCandidate& c : plan.candidates)
    if (strategy_family(c.candidate) != strategy_family(chosen->candidate)) others.push_back(&c);
  if (const PlanCandidate* r = best_of(others, plan.objective))
    out += "  Runner-up (another strategy): " + r->id() + ", " + versus(*chosen, *r) + ".\n";
  std::vector<const PlanCandidate*> all;
  for (const PlanCandidate& c : plan.candidates) all.push_back(&c);
  const Objective other_objective = by_speed ? Objective::kBatch : Objective::kThroughput;
  const PlanCandidate* alt = best_of(all, other_objective);
  if (alt && alt->id() != chosen->id())
    out += std::string("  ") + (by_speed ? "The largest batch" : "The fastest") + ": " + alt->id() + ", " +
           versus(*chosen, *alt) + ".\n";
  return out;
}

std::string format_sweep_grid(const std::vector<Plan>& plans) {
  // One column per sharding any plan has, in the order they first appear.
  std::vector<std::string> shardings;
  for (const Plan& p : plans)
    for (const PlanCandidate& c : p.candidates) {
      const std::string s = sharding_name(c.candidate.sharding);
      if (std::find(shardings.begin(), shardings.end(), s) == shardings.end()) shardings.push_back(s);
    }
  std::vector<std::string> header = {"seq len", "GPUs", "nodes", "memory/GPU"};
  header.insert(header.end(), shardings.begin(), shardings.end());
  header.insert(header.end(), {"chosen", "batch/GPU", "tokens/s"});
  std::vector<std::vector<std::string>> cells = {header};
  for (const Plan& p : plans) {
    std::vector<std::string> row = {std::to_string(p.model.seq_len), std::to_string(p.hardware.gpus_per_node),
                                    std::to_string(p.hardware.nodes),
                                    p.hardware.device_mem_bytes > 0 ? format_size(p.hardware.device_mem_bytes)
                                                                    : std::string("unlimited")};
    for (const std::string& s : shardings) {
      std::vector<const PlanCandidate*> of;
      for (const PlanCandidate& c : p.candidates)
        if (sharding_name(c.candidate.sharding) == s) of.push_back(&c);
      const PlanCandidate* best = best_of(of, Objective::kBatch);
      row.push_back(best ? std::to_string(best->max_batch_per_gpu) : of.empty() ? "-" : "0");
    }
    const PlanCandidate* chosen = p.find(p.chosen);
    row.push_back(chosen ? chosen->id() : "nothing fits");
    row.push_back(chosen ? std::to_string(chosen->max_batch_per_gpu) : "0");
    row.push_back(chosen ? tokens_cell(*chosen) : "-");
    cells.push_back(row);
  }
  std::vector<bool> right(header.size(), true);
  right[header.size() - 3] = false;
  std::string out;
  if (!plans.empty())
    out = plans.front().model.name + " on " + plans.front().hardware.profile +
          ": the largest batch per GPU each sharding fits (with any offload, checkpointing, precision and wrap; "
          "- where none was planned), and the chosen plan (--objective " +
          objective_name(plans.front().objective) + ")\n";
  return out + render(cells, right);
}

std::string sweep_to_json_text(const std::vector<Plan>& plans) {
  nlohmann::json j = {{"schema", kPlanSweepSchema}, {"plans", nlohmann::json::array()}};
  for (const Plan& p : plans) j["plans"].push_back(nlohmann::json(p));
  return j.dump(2) + "\n";
}

}  // namespace shardfit::planner
