#include "launch/run_outcome.h"

#include <algorithm>
#include <cstring>
#include <iostream>

#include "spec/errors.h"
#include "spec/exit_codes.h"

namespace shardfit::launch {
using spec::BadInput;
using spec::kExitOk;
using spec::kExitOom;

int oom_exit(bool oom_ok, const std::string& report_path, const reports::RunReport& report) {
  std::string ranks;
  for (const auto& rk : report.ranks)
    if (rk.oom) ranks += (ranks.empty() ? "" : ",") + std::to_string(rk.rank);
  if (ranks.empty() || oom_ok) return kExitOk;
  std::cerr << "shardfit run: out of memory on rank(s) " << ranks
            << (report_path.empty() ? "" : " (report written to " + report_path + ")")
            << "; --oom-ok exits 0\n";
  return kExitOom;
}

bool launch_went_oom(const executor::LaunchResult& result) {
  return !result.failed_ranks.empty() &&
         std::all_of(result.failed_ranks.begin(), result.failed_ranks.end(), [&](int r) {
           const executor::RankExit& e = result.ranks[r];
           return e.how == executor::RankExit::How::kExited && e.code == kExitOom;
         });
}

reports::MemoryFigures predicted_figures(const planner::StepSimResult& sim) {
  reports::MemoryFigures f;
  f.peak_allocated_bytes = sim.peak_allocated_bytes;
  f.peak_reserved_bytes = sim.peak_reserved_bytes;
  f.timeline = sim.timeline;
  for (const auto& bytes : sim.timeline_category_bytes) {
    auto& classes = f.timeline_category_bytes.emplace_back();
    for (int c = 0; c < planner::kNumCategories; ++c)
      classes[planner::category_name(static_cast<planner::Category>(c))] = bytes[c];
  }
  for (int c = 0; c < planner::kNumCategories; ++c)
    f.breakdown_bytes[planner::category_name(static_cast<planner::Category>(c))] =
        sim.peak_breakdown_bytes[c];
  return f;
}

// `cuda_peak_reserved` >= 0: a CUDA run, whose reserved figures (peak and
// timeline) are the caching allocator's; -1: CPU, nothing is cached.
reports::RankReport rank_report(int rank, int64_t peak,
                                const std::vector<executor::TimelinePoint>& timeline, bool oom,
                                const std::string& oom_message, int64_t cuda_peak_reserved) {
  const bool cuda = cuda_peak_reserved >= 0;
  reports::RankReport r;
  r.rank = rank;
  r.measured.peak_allocated_bytes = peak;
  r.measured.peak_reserved_bytes = cuda ? cuda_peak_reserved : peak;
  r.measured.timeline = timeline;
  if (!cuda)
    for (auto& t : r.measured.timeline) t.reserved_bytes = t.allocated_bytes;
  r.oom = oom;
  r.oom_message = oom_message;
  return r;
}

// peak_error_pct on the figure that decides OOM on the device (SPEC):
// reserved on CUDA (`on_reserved`), allocated on the CPU.
void attach_prediction(std::vector<reports::RankReport>& ranks,
                       const std::optional<planner::CandidatePrediction>& pred, bool on_reserved) {
  if (!pred) return;
  for (auto& r : ranks) {
    r.predicted = predicted_figures(pred->sim);
    if (auto err = reports::peak_error_pct(*r.predicted, r.measured, on_reserved)) r.peak_error_pct = err;
  }
}

// Every rank's JSON text, on every rank: lengths, then the bytes, each
// all-gathered (a zero-padded all-reduce). Host memory, not counted (nccl:
// through `device`, after the run).
std::vector<std::string> all_gather_strings(executor::Communicator& comm, const std::string& mine,
                                            c10::Device device) {
  executor::ScopedUntracked host;
  const int n = comm.world_size();
  torch::Tensor lengths = torch::zeros({n}, torch::kLong);
  lengths[comm.rank()] = static_cast<int64_t>(mine.size());
  executor::all_reduce_host(comm, lengths, executor::ReduceOp::kSum, device);
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths[r].item<int64_t>());
  torch::Tensor bytes = torch::zeros({n * std::max<int64_t>(longest, 1)}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>() + comm.rank() * longest, mine.data(), mine.size());
  executor::all_reduce_host(comm, bytes, executor::ReduceOp::kSum, device);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    const char* p = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()) + r * longest;
    out.emplace_back(p, static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return out;
}

nlohmann::json rank_json(const reports::RankReport& r) {
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& t : r.measured.timeline)
    timeline.push_back({t.label, t.allocated_bytes, t.reserved_bytes, t.peak_allocated_bytes});
  nlohmann::json j = {{"rank", r.rank},
                      {"peak", r.measured.peak_allocated_bytes},
                      {"peak_reserved", r.measured.peak_reserved_bytes},
                      {"timeline", timeline},
                      {"oom", r.oom},
                      {"oom_message", r.oom_message}};
  if (r.init_read_bytes) j["init_read_bytes"] = *r.init_read_bytes;
  return j;
}

reports::RankReport rank_from_json(const nlohmann::json& j) {
  std::vector<executor::TimelinePoint> timeline;
  for (const auto& t : j.at("timeline"))
    timeline.push_back({t.at(0).get<std::string>(), t.at(1).get<int64_t>(), t.at(2).get<int64_t>(),
                        t.at(3).get<int64_t>()});  // label, allocated, reserved, peak allocated
  // Reserved as the rank measured it (on the CPU it equals allocated).
  reports::RankReport r = rank_report(j.at("rank").get<int>(), j.at("peak").get<int64_t>(), timeline,
                                      j.at("oom").get<bool>(), j.at("oom_message").get<std::string>(),
                                      j.at("peak_reserved").get<int64_t>());
  if (j.contains("init_read_bytes")) r.init_read_bytes = j.at("init_read_bytes").get<int64_t>();
  return r;
}

void check_ranks_agree(executor::Communicator& comm, const std::map<std::string, std::string>& job,
                       c10::Device device) {
  if (comm.world_size() <= 1) return;
  const std::vector<std::string> all = all_gather_strings(comm, nlohmann::json(job).dump(), device);
  const auto first = nlohmann::json::parse(all[0]).get<std::map<std::string, std::string>>();
  for (size_t r = 1; r < all.size(); ++r) {
    const auto other = nlohmann::json::parse(all[r]).get<std::map<std::string, std::string>>();
    for (const auto& [option, value] : first) {
      auto it = other.find(option);
      const std::string theirs = it == other.end() ? "(unset)" : it->second;
      if (theirs != value)
        throw BadInput(option + ": rank " + std::to_string(r) + " has '" + theirs +
                       "', rank 0 has '" + value + "' (every rank must run the same job)");
    }
  }
}

}  // namespace shardfit::launch
