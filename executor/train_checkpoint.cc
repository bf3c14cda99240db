#include "executor/train_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#ifdef SHARDFIT_CUDA_TORCH
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <spdlog/spdlog.h>

#include "executor/meter.h"

namespace shardfit::executor {
namespace fs = std::filesystem;
namespace {

constexpr char kRngTensor[] = "rng/cpu";
constexpr char kCudaRngTensor[] = "rng/cuda";  // this rank's device's generator (dropout on CUDA)

std::string tensor_name(const FlatParam& u, const char* what) { return u.name() + "/" + what; }

UnitShardLayout unit_layout(const FlatParam& u) {
  return UnitShardLayout::from(u.name(), tensor_name(u, "master"), u.layout(), u.shard_rank());
}

// The default CPU generator's state (a uint8 tensor), under its lock.
torch::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Dropout on a GPU draws from that device's generator (Philox seed and
// offset), which the CPU generator's state does not cover. Undefined when
// the units do not compute on CUDA or this LibTorch has no CUDA.
std::optional<int> cuda_device_of(const std::vector<FlatParam*>& units) {
  for (FlatParam* u : units)
    for (const torch::Tensor& p : u->params())
      if (p.defined() && p.device().is_cuda()) return p.device().index();
  return std::nullopt;
}

#ifdef SHARDFIT_CUDA_TORCH
at::Generator cuda_generator(int device) { return at::cuda::detail::getDefaultCUDAGenerator(device); }
#endif

torch::Tensor cuda_rng_state([[maybe_unused]] int device) {
#ifdef SHARDFIT_CUDA_TORCH
  at::Generator gen = cuda_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
#else
  throw std::logic_error("CUDA parameters in a build without CUDA LibTorch");
#endif
}

void set_cuda_rng_state([[maybe_unused]] int device, [[maybe_unused]] const torch::Tensor& state) {
#ifdef SHARDFIT_CUDA_TORCH
  at::Generator gen = cuda_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
#endif
}

// A step-* directory's step, or -1 for any other name.
int64_t step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

int64_t int_meta(const fs::path& file, const nlohmann::json& meta, const char* key) {
  auto it = meta.find(key);
  if (it == meta.end() || !it->is_number_integer())
    throw std::invalid_argument(file.string() + ": metadata has no integer '" + key + "' (not a shardfit run checkpoint?)");
  return it->get<int64_t>();
}

// Test hook: SHARDFIT_TEST_SLOW_SAVE_S=S holds every save S seconds between
// the rank files and the commit, so a test can signal a save in progress.
void pause_before_commit_for_testing(int64_t step, int rank) {
  const char* s = std::getenv("SHARDFIT_TEST_SLOW_SAVE_S");
  if (s == nullptr) return;
  if (rank == 0) spdlog::info("step {}: saving, {} s before the commit (SHARDFIT_TEST_SLOW_SAVE_S)", step, s);
  std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(s)));
}

}  // namespace

fs::path step_checkpoint_dir(const fs::path& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06lld", static_cast<long long>(step));
  return root / name;
}

fs::path resolve_resume_dir(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw std::invalid_argument(path.string() + ": no such checkpoint directory");
  if (fs::exists(path / "manifest.json", ec)) return path;
  fs::path best;
  int64_t best_step = -1;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const int64_t step = step_of(entry.path());
    // Only committed checkpoints: a save that died before its manifest
    // leaves a directory without one, which must not be resumed from.
    if (step > best_step && fs::exists(entry.path() / "manifest.json", ec)) {
      best = entry.path();
      best_step = step;
    }
  }
  if (best_step < 0)
    throw std::invalid_argument(path.string() + ": holds no committed checkpoint (no step-*/manifest.json)");
  return best;
}

void save_training_checkpoint(const fs::path& dir, Communicator& world, const std::vector<FlatParam*>& units,
                              const TrainingProgress& progress, const nlohmann::json& job) {
  ScopedUntracked host;  // file buffers and copies are host memory
  RankState state;
  nlohmann::json with_state = nlohmann::json::array();
  for (FlatParam* u : units) {
    state.units.push_back(unit_layout(*u));
    state.tensors[tensor_name(*u, "master")] = u->master();
    if (u->exp_avg().defined()) {
      state.tensors[tensor_name(*u, "exp_avg")] = u->exp_avg();
      state.tensors[tensor_name(*u, "exp_avg_sq")] = u->exp_avg_sq();
      with_state.push_back(u->name());
    }
  }
  state.tensors[kRngTensor] = cpu_rng_state();
  if (const auto device = cuda_device_of(units)) state.tensors[kCudaRngTensor] = cuda_rng_state(*device);
  state.metadata = {{"step", progress.step},
                    {"optimizer_steps", progress.optimizer_steps},
                    {"skipped_steps", progress.skipped_steps},
                    {"loss_scale", progress.loss_scale},
                    {"loss_scale_good_steps", progress.loss_scale_good_steps},
                    {"units_with_optimizer_state", with_state},
                    {"job", job}};
  save_rank_checkpoint(dir, world.rank(), world.world_size(), state);
  pause_before_commit_for_testing(progress.step, world.rank());
  world.barrier();  // every rank file is on disk
  if (world.rank() == 0) write_checkpoint_manifest(dir, world.world_size());
  world.barrier();  // committed: nobody goes on (or exits) before it is
  if (world.rank() == 0 && step_of(dir) == progress.step) remove_checkpoint_litter(dir.parent_path(), progress.step);
}

int remove_checkpoint_litter(const fs::path& root, int64_t committed) {
  int removed = 0;
  std::error_code ec;
  auto remove = [&](const fs::path& p, const char* what) {
    std::error_code rm;
    fs::remove_all(p, rm);
    if (rm) {
      spdlog::warn("{}: cannot remove {} ({})", p.string(), what, rm.message());
    } else {
      spdlog::info("{}: removed {}", p.string(), what);
      ++removed;
    }
  };
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(entry.path());
    if (step < 0 || step > committed || !entry.is_directory(ec)) continue;
    if (step < committed && !fs::exists(entry.path() / "manifest.json", ec)) {
      remove(entry.path(), "an uncommitted checkpoint older than the latest committed one");
      continue;
    }
    for (const auto& f : fs::directory_iterator(entry.path(), ec))
      if (f.path().filename().string().find(".tmp.") != std::string::npos)
        remove(f.path(), "a stray temporary file of a save that did not finish");
  }
  return removed;
}

TrainingProgress load_training_checkpoint(const fs::path& dir, Communicator& world, Communicator& optimizer_group,
                                          const std::vector<FlatParam*>& units) {
  const fs::path file = dir / rank_file_name(world.rank(), world.world_size());
  const CheckpointInfo info = read_checkpoint_info(dir);
  // Which units had AdamW state when it was saved (all of them after a
  // step, unless a unit never received a gradient).
  std::vector<std::string> with_state;
  if (auto it = info.metadata.find("units_with_optimizer_state"); it != info.metadata.end() && it->is_array())
    with_state = it->get<std::vector<std::string>>();

  std::map<std::string, torch::Tensor> into;
  for (FlatParam* u : units) {
    into[tensor_name(*u, "master")] = u->master();
    if (std::find(with_state.begin(), with_state.end(), u->name()) != with_state.end()) {
      u->ensure_optimizer_state();  // device bytes, as the first step would allocate them
      into[tensor_name(*u, "exp_avg")] = u->exp_avg();
      into[tensor_name(*u, "exp_avg_sq")] = u->exp_avg_sq();
    }
  }
  torch::Tensor rng, cuda_rng;
  const std::optional<int> device = cuda_device_of(units);
  {
    ScopedUntracked host;
    rng = cpu_rng_state();
    into[kRngTensor] = rng;
    if (device) {
      cuda_rng = cuda_rng_state(*device);
      into[kCudaRngTensor] = cuda_rng;
    }
  }
  RankState state;
  {
    ScopedUntracked host;  // reads land in the job's own tensors; nothing else is device memory
    state = load_rank_checkpoint_into(dir, world.rank(), world.world_size(), into);
  }
  // The tensors fit; the layouts must be the same cut of the same model too
  // (the same shapes could come from another wrap of equal unit sizes).
  if (state.units.size() != units.size())
    throw std::invalid_argument(file.string() + ": holds " + std::to_string(state.units.size()) +
                                " units, this job wraps the model into " + std::to_string(units.size()) +
                                " (another wrap policy?)");
  for (size_t i = 0; i < units.size(); ++i) {
    if (state.units[i] != unit_layout(*units[i]))
      throw std::invalid_argument(file.string() + ": unit " + std::to_string(i) + " ('" + state.units[i].unit +
                                  "') is not laid out as this job's '" + units[i]->name() +
                                  "' (another model, wrap policy or sharding?)");
  }
  set_cpu_rng_state(rng);
  if (device) set_cuda_rng_state(*device, cuda_rng);
  for (FlatParam* u : units) u->publish_master(optimizer_group);

  TrainingProgress p;
  p.step = int_meta(file, state.metadata, "step");
  p.optimizer_steps = int_meta(file, state.metadata, "optimizer_steps");
  p.skipped_steps = int_meta(file, state.metadata, "skipped_steps");
  p.loss_scale_good_steps = int_meta(file, state.metadata, "loss_scale_good_steps");
  p.loss_scale = state.metadata.value("loss_scale", 0.0);
  return p;
}

}  // namespace shardfit::executor
