#include "planner/adamw_steps.h"

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace shardfit::planner {

const char* adamw_step_name(AdamwStep s) {
  switch (s) {
    case AdamwStep::kForeach:
      return "foreach";
    case AdamwStep::kFused:
      return "fused";
    case AdamwStep::kForLoop:
      break;
  }
  return "for-loop";
}

std::optional<AdamwStep> parse_adamw_step(const std::string& name) {
  for (AdamwStep s : {AdamwStep::kForLoop, AdamwStep::kForeach, AdamwStep::kFused})
    if (name == adamw_step_name(s)) return s;
  return std::nullopt;
}

int64_t adamw_step_ops(AdamwStep step, int64_t tensors) {
  switch (step) {
    case AdamwStep::kForeach:
      return 12 + 2 * tensors;
    case AdamwStep::kFused:
      return 4;
    case AdamwStep::kForLoop:
      break;
  }
  return 2 + 10 * tensors;
}

ModelTrace compose_optimizer_step(const std::vector<ModelTrace>& per_param, const std::vector<int>& params,
                                  bool first) {
  auto trace_of = [&](size_t i) -> const ModelTrace& {
    const size_t at = 2 * static_cast<size_t>(params[i]) + (first ? 0 : 1);
    if (at >= per_param.size()) throw std::invalid_argument("the trace file's per-parameter optimizer steps are short");
    return per_param[at];
  };
  // Per parameter: the storages its step keeps (state), its update's events,
  // the update's highest point, and the storage its update leaves to the
  // loop's next iteration. 1.13's for-loop AdamW (optim/adamw.py
  // _single_tensor_adamw) holds `denom = (exp_avg_sq.sqrt() / c).add_(eps)`
  // in a local that the next iteration only rebinds once its own denom is
  // made: a parameter's denom lives on through the next parameter's sqrt and
  // division, and the last one until the step returns. In a step traced for
  // one parameter alone that is the storage freed last, on return.
  struct Part {
    std::vector<MemEvent> kept, update;
    size_t top = 0;          // index into update after which it is highest
    int64_t carried = -1;    // the storage freed on return (-1: none)
  };
  std::vector<Part> parts(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& events = trace_of(i).events;
    std::unordered_map<int64_t, bool> freed;
    for (const auto& e : events)
      if (e.kind == MemEvent::kFree) freed[e.tensor] = true;
    Part& part = parts[i];
    int64_t live = 0, top = -1;
    std::unordered_map<int64_t, int64_t> size;
    for (const auto& e : events) {
      if (e.kind == MemEvent::kAlloc && !freed.count(e.tensor)) {
        part.kept.push_back(e);
        continue;
      }
      if (e.kind != MemEvent::kAlloc && e.kind != MemEvent::kFree) continue;
      part.update.push_back(e);
      if (e.kind == MemEvent::kAlloc) {
        size[e.tensor] = e.bytes;
        if ((live += e.bytes) > top) {
          top = live;
          part.top = part.update.size() - 1;
        }
      } else {
        live -= size[e.tensor];
      }
    }
    if (!part.update.empty() && part.update.back().kind == MemEvent::kFree) part.carried = part.update.back().tensor;
  }
  ModelTrace out;
  int64_t next_id = 1;
  std::vector<std::unordered_map<int64_t, int64_t>> ids(params.size());
  auto emit = [&](size_t i, const MemEvent& e) {
    MemEvent c = e;
    c.op = -1;
    if (e.kind == MemEvent::kAlloc) ids[i][e.tensor] = next_id++;
    c.tensor = ids[i].at(e.tensor);
    out.events.push_back(c);
  };
  // The state every parameter keeps, first (AdamW.step makes all state, then
  // runs the update loop); then the updates in order, each parameter's
  // carried storage freed after the next one's highest point.
  for (size_t i = 0; i < params.size(); ++i)
    for (const auto& e : parts[i].kept) emit(i, e);
  for (size_t i = 0; i < params.size(); ++i) {
    const Part& part = parts[i];
    for (size_t k = 0; k < part.update.size(); ++k) {
      const MemEvent& e = part.update[k];
      const bool own_carried_free = e.kind == MemEvent::kFree && e.tensor == part.carried && i + 1 < params.size();
      if (!own_carried_free) emit(i, e);
      if (k == part.top && i > 0 && parts[i - 1].carried >= 0) {
        MemEvent f;
        f.kind = MemEvent::kFree;
        f.tensor = parts[i - 1].carried;
        emit(i - 1, f);
      }
    }
  }
  return out;
}

namespace {

std::invalid_argument not_split(AdamwStep which, const std::string& why) {
  const std::string name = adamw_step_name(which);
  return std::invalid_argument("--adamw-step " + name + ": the trace file's AdamW(" +
                               (which == AdamwStep::kFused ? "fused" : "foreach") +
                               "=True) step does not split into its call's and its parameters' storages (" + why +
                               "): record it again with pytorch/trace_recorder.py");
}

// Alloc and free events only, each storage's id made its first appearance's
// index: two traces that allocate and free alike compare equal.
std::vector<std::pair<int, int64_t>> canonical(const ModelTrace& t) {
  std::vector<std::pair<int, int64_t>> out;
  std::unordered_map<int64_t, int64_t> id;
  for (const MemEvent& e : t.events) {
    if (e.kind != MemEvent::kAlloc && e.kind != MemEvent::kFree) continue;
    const int64_t at = id.emplace(e.tensor, static_cast<int64_t>(id.size())).first->second;
    out.emplace_back(e.kind, e.kind == MemEvent::kAlloc ? e.bytes : at);
  }
  return out;
}

}  // namespace

MultiTensorAdamwStep::MultiTensorAdamwStep(const ModelTrace& step, std::vector<int64_t> param_bytes, AdamwStep which)
    : param_bytes_(std::move(param_bytes)) {
  const int64_t n = static_cast<int64_t>(param_bytes_.size());
  if (n == 0) throw not_split(which, "no parameters");
  for (const MemEvent& e : step.events)
    if (e.kind == MemEvent::kAlloc || e.kind == MemEvent::kFree) events_.push_back({e});
  // The trailing frees outside any op are the step's return (its locals
  // dropped); a storage freed there is an output, one freed before it a
  // transient.
  size_t tail = events_.size();
  while (tail > 0 && events_[tail - 1].e.kind == MemEvent::kFree && events_[tail - 1].e.op < 0) --tail;
  std::unordered_map<int64_t, size_t> free_at;
  for (size_t i = 0; i < events_.size(); ++i)
    if (events_[i].e.kind == MemEvent::kFree) free_at[events_[i].e.tensor] = i;
  // Transients in top-level groups (a group opens with a transient made
  // while none is alive and closes when none is); every storage gets its
  // owner and its run: (what it is, which pass over the parameters).
  enum Kind { kKept, kOutput, kGroup };
  std::map<std::pair<int, int64_t>, int> runs;
  std::unordered_map<int64_t, std::pair<int, int>> of_tensor;  // storage -> (owner, run)
  int64_t kept = 0, outputs = 0, groups = 0, live_transients = 0;
  std::pair<int, int> group{-1, -1};  // the open group's (owner, run)
  auto run_of = [&](Kind k, int64_t pass) { return runs.emplace(std::make_pair(k, pass), runs.size()).first->second; };
  for (size_t i = 0; i < events_.size(); ++i) {
    Event& ev = events_[i];
    const MemEvent& e = ev.e;
    if (e.kind == MemEvent::kFree) {
      const auto it = of_tensor.find(e.tensor);
      if (it == of_tensor.end()) throw not_split(which, "a storage freed that it did not allocate");
      std::tie(ev.owner, ev.run) = it->second;
      ev.late_free = i >= tail && ev.owner >= 0;
      if (i < tail) --live_transients;
      continue;
    }
    const auto f = free_at.find(e.tensor);
    std::pair<int, int> at;
    if (f == free_at.end()) {
      at = {-2, run_of(kKept, 0)};  // owner once the count is known
      ++kept;
    } else if (f->second >= tail) {
      at = {static_cast<int>(outputs % n), run_of(kOutput, outputs / n)};
      ++outputs;
    } else {
      if (live_transients++ == 0) {
        const bool per_call = e.op >= 0 && static_cast<size_t>(e.op) < step.op_names.size() &&
                              step.op_names[e.op] == "aten::empty";
        group = per_call ? std::make_pair(-1, -1)
                         : std::make_pair(static_cast<int>(groups % n), run_of(kGroup, groups / n));
        if (!per_call) ++groups;
      }
      at = group;
    }
    std::tie(ev.owner, ev.run) = at;
    of_tensor[e.tensor] = at;
  }
  if (kept % n || outputs % n || groups % n)
    throw not_split(which, std::to_string(kept) + " kept, " + std::to_string(outputs) + " returned and " +
                    std::to_string(groups) + " per-tensor groups of storages for " + std::to_string(n) +
                    " parameters");
  // The state: the same number per parameter, made parameter by parameter.
  int64_t k = 0;
  for (Event& ev : events_)
    if (ev.owner == -2) ev.owner = static_cast<int>(k++ / (kept / n));
  blocks_.assign(runs.size(), std::vector<std::vector<size_t>>(n));
  for (size_t i = 0; i < events_.size(); ++i)
    if (events_[i].owner >= 0 && !events_[i].late_free) blocks_[events_[i].run][events_[i].owner].push_back(i);
  std::vector<Entry> all;
  for (int p = 0; p < n; ++p) all.push_back({p, param_bytes_[p]});
  if (canonical(compose(all)) != canonical(step)) throw not_split(which, "the parameters' parts do not rebuild it");
}

ModelTrace MultiTensorAdamwStep::compose(const std::vector<Entry>& list) const {
  ModelTrace out;
  int64_t next = 1;
  std::unordered_map<int64_t, int64_t> call_ids;                    // the call's storages
  std::vector<std::unordered_map<int64_t, int64_t>> ids(list.size());  // each entry's
  std::vector<bool> run_done(blocks_.size(), false);
  auto emit = [&](MemEvent e, std::unordered_map<int64_t, int64_t>& map, int64_t resize_from, int64_t to) {
    if (e.kind == MemEvent::kAlloc) {
      map[e.tensor] = next++;
      if (e.bytes == resize_from) e.bytes = to;
    }
    e.tensor = map.at(e.tensor);
    e.op = -1;
    out.events.push_back(e);
  };
  for (const Event& ev : events_) {
    if (ev.owner < 0) {
      emit(ev.e, call_ids, -1, 0);
    } else if (ev.late_free) {
      for (size_t i = list.size(); i-- > 0;)
        if (list[i].param == ev.owner) emit(ev.e, ids[i], -1, 0);
    } else if (!run_done[ev.run]) {
      // A run's first event: the run for every entry, in the list's order.
      run_done[ev.run] = true;
      for (size_t i = 0; i < list.size(); ++i) {
        const int p = list[i].param;
        if (p < 0 || p >= static_cast<int>(param_bytes_.size()))
          throw std::invalid_argument("MultiTensorAdamwStep: no parameter " + std::to_string(p));
        for (size_t x : blocks_[ev.run][p]) emit(events_[x].e, ids[i], param_bytes_[p], list[i].bytes);
      }
    }
  }
  return out;
}

}  // namespace shardfit::planner
