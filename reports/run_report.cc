#include "reports/run_report.h"

#include "reports/json_whole.h"
#include "spec/job.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <type_traits>

namespace shardfit::reports {
namespace {

constexpr const char* kSchema = "shardfit.report/1";

nlohmann::json figures_json(const MemoryFigures& f) {
  nlohmann::json timeline = nlohmann::json::array();
  for (size_t i = 0; i < f.timeline.size(); ++i) {
    const TimelinePoint& s = f.timeline[i];
    timeline.push_back({{"phase", s.label},
                        {"allocated_bytes", s.allocated_bytes},
                        {"reserved_bytes", s.reserved_bytes},
                        {"peak_allocated_bytes", s.peak_allocated_bytes}});
    if (i < f.timeline_category_bytes.size() && !f.timeline_category_bytes[i].empty())
      timeline.back()["category_bytes"] = f.timeline_category_bytes[i];
  }
  nlohmann::json j = {{"peak_allocated_bytes", f.peak_allocated_bytes},
                      {"peak_reserved_bytes", f.peak_reserved_bytes},
                      {"timeline", timeline}};
  if (!f.breakdown_bytes.empty()) j["breakdown_bytes"] = f.breakdown_bytes;
  return j;
}

const nlohmann::json& field(const nlohmann::json& j, const char* name, const std::string& where) {
  if (!j.is_object() || !j.contains(name))
    throw std::invalid_argument(where + ": missing field '" + name + "'");
  return j.at(name);
}

template <typename T>
T get(const nlohmann::json& j, const char* name, const std::string& where) {
  const auto& v = field(j, name, where);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return json_whole<T>(v, where + ": field '" + name + "'");
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument(where + ": field '" + name + "' has the wrong type");
    }
  }
}

MemoryFigures figures_from(const nlohmann::json& j, const std::string& where) {
  MemoryFigures f;
  f.peak_allocated_bytes = get<int64_t>(j, "peak_allocated_bytes", where);
  f.peak_reserved_bytes = get<int64_t>(j, "peak_reserved_bytes", where);
  for (const auto& s : field(j, "timeline", where)) {
    TimelinePoint t;
    t.label = get<std::string>(s, "phase", where + ".timeline");
    t.allocated_bytes = get<int64_t>(s, "allocated_bytes", where + ".timeline");
    t.reserved_bytes = s.contains("reserved_bytes")
                           ? json_whole<int64_t>(s["reserved_bytes"], where + ".timeline: reserved_bytes")
                           : t.allocated_bytes;
    t.peak_allocated_bytes =
        s.contains("peak_allocated_bytes")
            ? json_whole<int64_t>(s["peak_allocated_bytes"], where + ".timeline: peak_allocated_bytes")
            : t.allocated_bytes;
    std::map<std::string, int64_t> classes;
    if (s.contains("category_bytes")) {
      if (!s["category_bytes"].is_object())
        throw std::invalid_argument(where + ".timeline: field 'category_bytes' must be an object");
      for (const auto& [k, v] : s["category_bytes"].items()) {
        classes[k] = json_whole<int64_t>(v, where + ".timeline: category_bytes." + k);
      }
    }
    if (!classes.empty()) {
      f.timeline_category_bytes.resize(f.timeline.size());
      f.timeline_category_bytes.push_back(classes);
    }
    f.timeline.push_back(t);
  }
  if (j.contains("breakdown_bytes") && j["breakdown_bytes"].is_object())
    for (const auto& [k, v] : j["breakdown_bytes"].items())
      f.breakdown_bytes[k] = json_whole<int64_t>(v, where + ": breakdown_bytes." + k);
  return f;
}

}  // namespace

void set_step_time(RunReport& r, double tokens_per_step, std::optional<double> predicted_step_time_s) {
  r.step_time_measured_s.reset();
  r.step_time_predicted_s.reset();
  r.step_time_error_pct.reset();
  if (!(r.tokens_per_s > 0) || !(tokens_per_step > 0)) return;
  const double measured = tokens_per_step / r.tokens_per_s;
  r.step_time_measured_s = measured;
  if (!predicted_step_time_s || !(*predicted_step_time_s > 0)) return;
  r.step_time_predicted_s = *predicted_step_time_s;
  r.step_time_error_pct = 100.0 * (*predicted_step_time_s - measured) / measured;
}

nlohmann::json to_json(const RunReport& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& rk : r.ranks) {
    nlohmann::json j = {{"rank", rk.rank}, {"measured", figures_json(rk.measured)}};
    j["predicted"] = rk.predicted ? figures_json(*rk.predicted) : nlohmann::json(nullptr);
    j["peak_error_pct"] = rk.peak_error_pct ? nlohmann::json(*rk.peak_error_pct) : nullptr;
    j["oom"] = rk.oom;
    if (rk.oom) j["oom_message"] = rk.oom_message;
    if (rk.init_read_bytes) j["init_read_bytes"] = *rk.init_read_bytes;
    ranks.push_back(j);
  }
  auto opt = [](const auto& v) {  // std::optional<int64_t> or <double>
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  return {{"schema", kSchema},
          {"candidate", r.candidate},
          {"model", r.model},
          {"hardware", r.hardware},
          {"run",
           {{"batch_per_gpu", r.batch_per_gpu},
            {"prefetch", r.schedule.prefetch},
            {"ddp_bucket_cap_bytes", r.schedule.ddp_bucket_cap_bytes},
            {"ddp_bucket_bytes", r.ddp_bucket_bytes},
            {"async_reduce", r.schedule.async_reduce},
            {"async_gather", r.schedule.async_gather},
            {"world_size", r.world_size},
            {"backend", r.backend},
            {"device", r.device},
            {"steps", r.steps},
            {"first_step", r.first_step},
            {"loss", r.loss},
            {"tokens_per_s", r.tokens_per_s},
            {"step_time_s", {{"measured", opt(r.step_time_measured_s)}, {"predicted", opt(r.step_time_predicted_s)}}},
            {"step_time_error_pct", opt(r.step_time_error_pct)},
            {"checkpoints", r.checkpoints},
            {"resumed_from", r.resumed_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.resumed_from)},
            {"resume_changes", r.resume_changes},
            {"init", r.init_from.empty() ? nlohmann::json(nullptr)
                                         : nlohmann::json{{"path", r.init_from}, {"data_bytes", r.init_data_bytes}}},
            {"diverged_at_step", r.diverged_at_step > 0 ? nlohmann::json(r.diverged_at_step) : nlohmann::json(nullptr)},
            {"interrupted", r.interrupted},
            {"saved_on_signal_step",
             r.saved_on_signal_step > 0 ? nlohmann::json(r.saved_on_signal_step) : nlohmann::json(nullptr)}}},
          {"ranks", ranks},
          {"max_batch", {{"predicted", opt(r.max_batch_predicted)}, {"measured", opt(r.max_batch_measured)}}},
          {"machine", r.machine ? to_json(*r.machine) : nlohmann::json(nullptr)},
          {"command", r.command},
          {"created", r.created}};
}

std::optional<double> peak_error_pct(const MemoryFigures& predicted, const MemoryFigures& measured,
                                     bool on_reserved) {
  const int64_t p = on_reserved ? predicted.peak_reserved_bytes : predicted.peak_allocated_bytes;
  const int64_t m = on_reserved ? measured.peak_reserved_bytes : measured.peak_allocated_bytes;
  if (m <= 0) return std::nullopt;
  return 100.0 * static_cast<double>(p - m) / static_cast<double>(m);
}

namespace {

// 1 PiB: above any device or host a rank has; 2^62 bytes is a made-up figure.
constexpr int64_t kMaxBytes = int64_t{1} << 50;
// Tokens a second above any job: 2^20 ranks at a million tokens/s each.
constexpr double kMaxTokensPerS = 1e12;
// The largest batch a report can name, the most micro-batches a step can
// accumulate and the most steps a run takes: run's bounds (spec/job.h).
constexpr int64_t kMaxBatch = spec::kMaxBatch;
constexpr int64_t kMaxGradAccum = spec::kMaxGradAccum;
constexpr int64_t kMaxSteps = spec::kMaxSteps;

using Refuse = std::function<void(const std::string&)>;

// One side (measured or predicted) of a rank: every byte count a count a
// device can hold, the allocated peak within the reserved one (an allocator
// reserves what it hands out), and no timeline point above its peak (a peak
// is the most the timeline reached).
void check_figures(const MemoryFigures& f, const std::string& who, const Refuse& bad) {
  auto bytes = [&](int64_t b, const std::string& what) {
    if (b < 0 || b > kMaxBytes) bad(who + "." + what + " " + std::to_string(b) + ": not a byte count (0 to 2^50)");
  };
  bytes(f.peak_allocated_bytes, "peak_allocated_bytes");
  bytes(f.peak_reserved_bytes, "peak_reserved_bytes");
  if (f.peak_allocated_bytes > f.peak_reserved_bytes)
    bad(who + ".peak_allocated_bytes " + std::to_string(f.peak_allocated_bytes) + " is above peak_reserved_bytes " +
        std::to_string(f.peak_reserved_bytes) + " (an allocator reserves what it hands out)");
  for (size_t i = 0; i < f.timeline.size(); ++i) {
    const TimelinePoint& t = f.timeline[i];
    const std::string at = "timeline[" + std::to_string(i) + "] ('" + t.label + "')";
    for (const auto& [b, what, peak] : {std::tuple{t.allocated_bytes, "allocated_bytes", f.peak_allocated_bytes},
                                        std::tuple{t.peak_allocated_bytes, "peak_allocated_bytes", f.peak_allocated_bytes},
                                        std::tuple{t.reserved_bytes, "reserved_bytes", f.peak_reserved_bytes}}) {
      bytes(b, at + "." + what);
      if (b > peak)
        bad(who + "." + at + "." + what + " " + std::to_string(b) + " is above the rank's peak " + std::to_string(peak));
    }
    if (i < f.timeline_category_bytes.size())
      for (const auto& [k, b] : f.timeline_category_bytes[i]) bytes(b, at + ".category_bytes." + k);
  }
  for (const auto& [k, b] : f.breakdown_bytes) bytes(b, "breakdown_bytes." + k);
}

// The run's own figures: what it ran on, one loss a step, a speed a job can
// have, and the step time and its error as its tokens/s and prediction give
// them (compare gates on the error).
void check_run_figures(const RunReport& r, const Refuse& bad) {
  if (r.device != "cpu" && r.device != "cuda") bad("run.device '" + r.device + "': expected cpu or cuda");
  if (r.backend != "gloo" && r.backend != "nccl" && r.backend != "loopback" && r.backend != "none")
    bad("run.backend '" + r.backend + "': expected gloo, nccl, loopback or none");
  if (r.batch_per_gpu < 1 || r.batch_per_gpu > kMaxBatch)
    bad("run.batch_per_gpu " + std::to_string(r.batch_per_gpu) + ": must be 1 to " + std::to_string(kMaxBatch));
  if (r.steps < 0) bad("run.steps " + std::to_string(r.steps) + ": must not be negative");
  if (r.first_step < 1 || r.first_step > kMaxSteps)
    bad("run.first_step " + std::to_string(r.first_step) + ": must be 1 to " + std::to_string(kMaxSteps));
  if (r.steps > kMaxSteps) bad("run.steps " + std::to_string(r.steps) + ": above " + std::to_string(kMaxSteps));
  if (static_cast<int64_t>(r.loss.size()) != r.steps)
    bad("run.loss has " + std::to_string(r.loss.size()) + " entries for run.steps " + std::to_string(r.steps) +
        " (one a step)");
  for (const auto& [step, what] : {std::pair{r.diverged_at_step, "diverged_at_step"},
                                   std::pair{r.saved_on_signal_step, "saved_on_signal_step"}})
    if (step != 0 && (step < r.first_step || step >= r.first_step + r.steps))
      bad("run." + std::string(what) + " " + std::to_string(step) + ": not one of the steps the run reports");
  for (int64_t b : r.ddp_bucket_bytes)
    if (b < 1 || b > kMaxBytes) bad("run.ddp_bucket_bytes holds " + std::to_string(b) + ": not a bucket's bytes");
  if (!(r.tokens_per_s >= 0 && r.tokens_per_s <= kMaxTokensPerS))
    bad("run.tokens_per_s " + std::to_string(r.tokens_per_s) + ": must be 0 to 1e12");
  if (r.init_data_bytes < 0 || r.init_data_bytes > kMaxBytes)
    bad("run.init.data_bytes " + std::to_string(r.init_data_bytes) + ": not a byte count (0 to 2^50)");
  for (const auto& [v, what] : {std::pair{r.max_batch_predicted, "max_batch.predicted"},
                                std::pair{r.max_batch_measured, "max_batch.measured"}})
    if (v && (*v < 0 || *v > kMaxBatch))
      bad(std::string(what) + " " + std::to_string(*v) + ": must be 0 to " + std::to_string(kMaxBatch));
  for (const auto& [v, what] : {std::pair{r.step_time_measured_s, "measured"},
                                std::pair{r.step_time_predicted_s, "predicted"}})
    if (v && !(*v > 0 && std::isfinite(*v)))
      bad("run.step_time_s." + std::string(what) + " " + std::to_string(*v) + ": must be a time above 0");
  // measured = tokens a step / tokens_per_s, a step being world x batch x
  // seq_len tokens times the micro-batches it accumulates (a whole number).
  const auto seq = r.model.is_object() && r.model.contains("seq_len") && r.model["seq_len"].is_number_integer()
                       ? r.model["seq_len"].get<int64_t>()
                       : int64_t{0};
  if (r.step_time_measured_s && r.tokens_per_s > 0 && seq > 0) {
    const double micro = *r.step_time_measured_s * r.tokens_per_s /
                         (static_cast<double>(r.world_size) * static_cast<double>(r.batch_per_gpu) * static_cast<double>(seq));
    if (std::fabs(micro - std::round(micro)) > 1e-6 * std::max(1.0, micro) || std::round(micro) < 1 ||
        std::round(micro) > kMaxGradAccum)
      bad("run.step_time_s.measured " + std::to_string(*r.step_time_measured_s) + " is not what run.tokens_per_s " +
          std::to_string(r.tokens_per_s) + " gives for steps of world x batch x seq_len tokens");
  }
  const bool both = r.step_time_measured_s && r.step_time_predicted_s;
  const std::optional<double> derived =
      both ? std::optional<double>(100.0 * (*r.step_time_predicted_s - *r.step_time_measured_s) / *r.step_time_measured_s)
           : std::nullopt;
  if (r.step_time_error_pct.has_value() != derived.has_value() ||
      (derived && std::fabs(*r.step_time_error_pct - *derived) > 1e-9 * std::max(1.0, std::fabs(*derived))))
    bad("run.step_time_error_pct " + (r.step_time_error_pct ? std::to_string(*r.step_time_error_pct) : "null") +
        " is not what its step times give (" + (derived ? std::to_string(*derived) : "null") + ")");
}

}  // namespace

// What no run can write: a report that says so is damaged or edited, and
// `compare` would pass it or `report` draw it. Every derived figure (each
// rank's peak_error_pct, the step time and its error) must be what the raw
// figures give.
void check_consistent(const RunReport& r, const std::string& origin) {
  const Refuse bad = [&](const std::string& what) { throw std::invalid_argument(origin + ": " + what); };
  if (r.world_size < 1 || r.world_size > (1 << 20)) bad("run.world_size " + std::to_string(r.world_size) + ": must be 1 to 1048576");
  check_run_figures(r, bad);
  if (r.ranks.size() > static_cast<size_t>(r.world_size))
    bad(std::to_string(r.ranks.size()) + " ranks in a world of " + std::to_string(r.world_size));
  // Every rank writes its figures into the one report, except loopback
  // (rank 0 alone, standing in for the world).
  if ((r.backend == "gloo" || r.backend == "nccl") && r.ranks.size() != static_cast<size_t>(r.world_size))
    bad(std::to_string(r.ranks.size()) + " ranks for a " + r.backend + " world of " + std::to_string(r.world_size));
  std::vector<bool> seen(static_cast<size_t>(r.world_size), false);
  for (const RankReport& rk : r.ranks) {
    const std::string who = "rank " + std::to_string(rk.rank);
    if (rk.rank < 0 || rk.rank >= r.world_size)
      bad(who + ": outside a world of " + std::to_string(r.world_size));
    if (seen[static_cast<size_t>(rk.rank)]) bad(who + ": listed twice");
    seen[static_cast<size_t>(rk.rank)] = true;
    check_figures(rk.measured, who + ".measured", bad);
    if (rk.predicted) check_figures(*rk.predicted, who + ".predicted", bad);
    if (rk.init_read_bytes && (*rk.init_read_bytes < 0 || *rk.init_read_bytes > r.init_data_bytes))
      bad(who + ".init_read_bytes " + std::to_string(*rk.init_read_bytes) + ": not 0 to run.init.data_bytes " +
          std::to_string(r.init_data_bytes));
    const std::optional<double> derived =
        rk.predicted ? peak_error_pct(*rk.predicted, rk.measured, r.device == "cuda") : std::nullopt;
    if (rk.peak_error_pct.has_value() != derived.has_value() ||
        (derived && std::fabs(*rk.peak_error_pct - *derived) > 1e-9 * std::max(1.0, std::fabs(*derived))))
      bad(who + ": peak_error_pct " + (rk.peak_error_pct ? std::to_string(*rk.peak_error_pct) : "null") +
          " is not what its bytes give (" + (derived ? std::to_string(*derived) : "null") + ")");
  }
}

RunReport report_from_json_unchecked(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("schema") || j["schema"] != kSchema)
    throw std::invalid_argument(origin + ": not a shardfit report (expected \"schema\": \"" +
                                kSchema + "\")");
  RunReport r;
  r.candidate = get<std::string>(j, "candidate", origin);
  r.model = field(j, "model", origin);
  r.hardware = field(j, "hardware", origin);
  // Read as numbers by the renderers: checked here, once.
  for (const auto& [obj, key] : {std::pair{&r.hardware, "device_mem_bytes"}, std::pair{&r.model, "params"},
                                 std::pair{&r.model, "seq_len"}})
    if (obj->is_object() && obj->contains(key) && !(*obj)[key].is_null()) {
      const int64_t v = json_whole<int64_t>((*obj)[key], origin + ": field '" + key + "'");
      if (v < 1 || v > kMaxBytes)  // a count of bytes, parameters or tokens a job has
        throw std::invalid_argument(origin + ": field '" + key + "' is " + std::to_string(v) + ": must be 1 to 2^50");
    }
  const auto& run = field(j, "run", origin);
  const std::string w = origin + ": run";
  r.batch_per_gpu = get<int64_t>(run, "batch_per_gpu", w);
  r.world_size = get<int>(run, "world_size", w);
  if (run.contains("prefetch")) r.schedule.prefetch = get<int>(run, "prefetch", w);
  if (run.contains("ddp_bucket_cap_bytes")) r.schedule.ddp_bucket_cap_bytes = get<int64_t>(run, "ddp_bucket_cap_bytes", w);
  if (run.contains("ddp_bucket_bytes")) r.ddp_bucket_bytes = get<std::vector<int64_t>>(run, "ddp_bucket_bytes", w);
  if (run.contains("async_reduce")) r.schedule.async_reduce = get<bool>(run, "async_reduce", w);
  if (run.contains("async_gather")) r.schedule.async_gather = get<bool>(run, "async_gather", w);
  r.backend = get<std::string>(run, "backend", w);
  r.device = get<std::string>(run, "device", w);
  r.steps = get<int64_t>(run, "steps", w);
  // A diverged run's last loss is NaN or Inf, which JSON writes as null.
  if (!field(run, "loss", w).is_array()) throw std::invalid_argument(w + ": field 'loss' has the wrong type");
  for (const auto& v : field(run, "loss", w)) {
    if (!v.is_null() && !v.is_number()) throw std::invalid_argument(w + ": field 'loss' has the wrong type");
    r.loss.push_back(v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>());
  }
  // Optional (reports before checkpoints were wired in lack them).
  if (run.contains("first_step")) r.first_step = get<int64_t>(run, "first_step", w);
  if (run.contains("checkpoints")) r.checkpoints = get<std::vector<std::string>>(run, "checkpoints", w);
  if (run.contains("resumed_from") && run["resumed_from"].is_string())
    r.resumed_from = run["resumed_from"].get<std::string>();
  if (run.contains("init") && !run["init"].is_null()) {
    const auto& init = run["init"];
    r.init_from = get<std::string>(init, "path", w + ".init");
    r.init_data_bytes = get<int64_t>(init, "data_bytes", w + ".init");
  }
  if (run.contains("resume_changes"))
    r.resume_changes = get<std::vector<std::string>>(run, "resume_changes", w);
  if (run.contains("diverged_at_step") && !run["diverged_at_step"].is_null())
    r.diverged_at_step = get<int64_t>(run, "diverged_at_step", w);
  if (run.contains("interrupted")) r.interrupted = get<bool>(run, "interrupted", w);
  if (run.contains("saved_on_signal_step") && !run["saved_on_signal_step"].is_null())
    r.saved_on_signal_step = get<int64_t>(run, "saved_on_signal_step", w);
  r.tokens_per_s = get<double>(run, "tokens_per_s", w);
  if (run.contains("step_time_s") && !run["step_time_s"].is_null()) {
    const auto& st = run["step_time_s"];
    if (!st.is_object()) throw std::invalid_argument(w + ": 'step_time_s' must be an object {measured, predicted}");
    for (const auto& [key, dst] : {std::pair{"measured", &r.step_time_measured_s},
                                   std::pair{"predicted", &r.step_time_predicted_s}})
      if (st.contains(key) && !st[key].is_null()) *dst = get<double>(st, key, w + ".step_time_s");
  }
  if (run.contains("step_time_error_pct") && !run["step_time_error_pct"].is_null())
    r.step_time_error_pct = get<double>(run, "step_time_error_pct", w);
  for (const auto& rk : field(j, "ranks", origin)) {
    RankReport x;
    const std::string wr = origin + ": ranks";
    x.rank = get<int>(rk, "rank", wr);
    x.measured = figures_from(field(rk, "measured", wr), wr + ".measured");
    if (rk.contains("predicted") && !rk["predicted"].is_null())
      x.predicted = figures_from(rk["predicted"], wr + ".predicted");
    if (rk.contains("peak_error_pct") && !rk["peak_error_pct"].is_null())
      x.peak_error_pct = rk["peak_error_pct"].get<double>();
    x.oom = rk.value("oom", false);
    x.oom_message = rk.value("oom_message", "");
    if (rk.contains("init_read_bytes") && !rk["init_read_bytes"].is_null())
      x.init_read_bytes = json_whole<int64_t>(rk["init_read_bytes"], wr + ".init_read_bytes");
    r.ranks.push_back(x);
  }
  if (j.contains("max_batch")) {
    const auto& mb = j["max_batch"];
    if (mb.contains("predicted") && !mb["predicted"].is_null())
      r.max_batch_predicted = json_whole<int64_t>(mb["predicted"], origin + ": max_batch.predicted");
    if (mb.contains("measured") && !mb["measured"].is_null())
      r.max_batch_measured = json_whole<int64_t>(mb["measured"], origin + ": max_batch.measured");
  }
  if (j.contains("machine") && !j["machine"].is_null())
    r.machine = machine_from_json(j["machine"], origin + ": machine");
  r.command = j.value("command", "");
  r.created = j.value("created", "");
  check_consistent(r, origin);
  return r;
}

RunReport report_from_json(const nlohmann::json& j, const std::string& origin) {
  try {
    return report_from_json_unchecked(j, origin);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong type somewhere the checked getters do not cover.
    std::string what = e.what();
    throw std::invalid_argument(origin + ": a field has the wrong type (" + what.substr(0, what.find('\n')) + ")");
  }
}

}  // namespace shardfit::reports
