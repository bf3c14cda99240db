// What PyTorch's stack shares (pytorch_stack.h): the loop's defaults,
// GradScaler's tensors, the ledger's replays, broadcast_coalesced, DDP's
// buckets and ZeroRedundancyOptimizer's partition. DDP's job itself is
// pytorch_ddp.cc.
#include "planner/pytorch_stack.h"

#include "planner/pytorch_ledger.h"
#include "spec/grad_buckets.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace shardfit::planner {

std::optional<DType> parse_fsdp_reduce_dtype(const std::string& name) {
  if (name == "param") return std::nullopt;
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kF16;
  throw std::invalid_argument("expected param, fp32, bf16 or fp16");
}

TorchDefaults torch_defaults(const std::string& torch) {
  // 1.13: Optimizer.zero_grad(set_to_none=False), checkpoint(use_reentrant=True)
  // (torch/optim/optimizer.py, torch/utils/checkpoint.py at v1.13.0).
  if (torch == "1.13") return {"zero", "reentrant"};
  // 2.11: zero_grad(set_to_none=True) (optimizer.py at v2.11.0); checkpoint()
  // given no use_reentrant warns and runs True, but transformers 5.17's
  // gradient_checkpointing_enable() passes use_reentrant=False
  // (modeling_utils.py), as torch's warning recommends.
  if (torch == kPinnedTorch) return {"none", "non-reentrant"};
  throw std::invalid_argument(std::string("expected ") + kPinnedTorch +
                              " (the pinned stack) or 1.13 (2022's, the reference scenario's)");
}

bool adamw_foreach_default(const std::string& torch, bool cuda, bool flat_parameters) {
  return torch != "1.13" && cuda && !flat_parameters;
}

bool grad_scaler_init(Ledger& ledger, const std::string& label) {
  for (int64_t b : {kGradScalerScaleBytes, kGradScalerGrowthTrackerBytes})
    if (ledger.alloc(Category::kOptimizer, b, label) < 0) return false;
  return true;
}

// grad_scaler.py 1.13's unscale_, in its order (pytorch_stack.h).
bool grad_scaler_unscale(Ledger& ledger, const std::string& label, int64_t& found_inf_copy, bool host_grads) {
  const Category c = Category::kOptimizer;
  const int64_t dbl = ledger.alloc(c, 8, label);  // self._scale.double()
  if (dbl < 0) return false;
  const int64_t rec = ledger.alloc(c, 8, label);  // .reciprocal()
  if (rec < 0) return false;
  ledger.free(dbl);
  const int64_t inv = ledger.alloc(c, 4, label);  // .float()
  if (inv < 0) return false;
  ledger.free(rec);
  const int64_t found = ledger.alloc(c, 4, label);  // torch.full((1,), 0.0)
  if (found < 0) return false;
  if (host_grads) {
    // ShardedGradScaler, the gradients on the host: both copies made there;
    // the found_inf synced through a GPU copy (`v_on_cuda = v.cuda()`),
    // alive until unscale_ returns.
    const int64_t on_gpu = ledger.alloc(c, 4, label);
    if (on_gpu < 0) return false;
    ledger.free(on_gpu);
  } else {
    found_inf_copy = ledger.alloc(c, 4, label);  // per_device_found_inf.get(device)
    if (found_inf_copy < 0) return false;
    const int64_t inv_copy = ledger.alloc(c, 4, label);  // per_device_inv_scale.get(device)
    if (inv_copy < 0) return false;
    ledger.free(inv_copy);  // _unscale_grads_ returns
  }
  ledger.free(inv);  // unscale_ returns
  ledger.free(found);
  return true;
}

bool grad_scaler_update(Ledger& ledger, const std::string& label, int64_t found_inf_copy, bool host_grads) {
  ledger.free(found_inf_copy);
  if (!host_grads) return true;
  // The host found_inf brought to the scale's device (`found_inf.to(device=
  // _scale.device)`), dropped as update() returns.
  const int64_t copy = ledger.alloc(Category::kOptimizer, 4, label);
  if (copy < 0) return false;
  ledger.free(copy);
  return true;
}

bool alloc_each(Ledger& ledger, Category c, const std::vector<int64_t>& bytes, const std::string& label,
                std::vector<int64_t>* ids) {
  for (int64_t b : bytes) {
    const int64_t id = ledger.alloc(c, b, label);
    if (ids) ids->push_back(id);
    if (id < 0) return false;
  }
  return true;
}

std::vector<int64_t> buffer_bytes(const std::vector<BufferInfo>& buffers) {
  std::vector<int64_t> bytes;
  for (const BufferInfo& b : buffers) bytes.push_back(b.bytes);
  return bytes;
}

void end_backward(Ledger& ledger, std::vector<int64_t>& outputs, std::vector<int64_t>& previous_outputs,
                  const std::string& step) {
  previous_outputs.swap(outputs);
  outputs.clear();
  ledger.point(step + "/backward");
}

bool optimizer_step(Ledger& ledger, const std::string& step, const ModelTrace* adamw, bool grad_scaler,
                    bool host_grads) {
  const std::string label = step + "/optimizer";
  int64_t found_inf_copy = -1;
  if (grad_scaler && !grad_scaler_unscale(ledger, label, found_inf_copy, host_grads)) return false;
  if (adamw && !replay(*adamw, ledger, label, Category::kTemporaries, Category::kOptimizer))
    return false;
  if (grad_scaler && !grad_scaler_update(ledger, label, found_inf_copy, host_grads)) return false;
  ledger.point(label);
  return true;
}

bool replay(const ModelTrace& t, Ledger& ledger, const std::string& label, Category transient, Category kept) {
  std::unordered_map<int64_t, int64_t> live;  // trace storage -> ledger id
  std::unordered_map<int64_t, bool> freed;
  for (const auto& e : t.events)
    if (e.kind == MemEvent::kFree) freed[e.tensor] = true;
  for (const auto& e : t.events) {
    if (e.kind == MemEvent::kAlloc) {
      const int64_t id = ledger.alloc(freed.count(e.tensor) ? transient : kept, e.bytes, label);
      if (id < 0) return false;
      live[e.tensor] = id;
    } else if (e.kind == MemEvent::kFree) {
      if (auto it = live.find(e.tensor); it != live.end()) {
        ledger.free(it->second);
        live.erase(it);
      }
    }
  }
  return true;
}


std::vector<int64_t> broadcast_coalesced_flats(const std::vector<CoalescedTensor>& tensors, int64_t bucket_bytes) {
  struct Bucket {
    size_t first = 0;
    int count = 0;
    int64_t bytes = 0;
  };
  std::vector<Bucket> closed;
  std::vector<std::pair<std::string, Bucket>> open;  // per dtype, in first-seen order
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto it = std::find_if(open.begin(), open.end(), [&](const auto& o) { return o.first == tensors[i].dtype; });
    if (it == open.end()) it = open.insert(open.end(), {tensors[i].dtype, Bucket{}});
    Bucket& b = it->second;
    if (b.count == 0) b.first = i;
    ++b.count;
    b.bytes += tensors[i].bytes;
    if (b.bytes >= bucket_bytes) {
      closed.push_back(b);
      b = Bucket{};
    }
  }
  for (const auto& o : open)
    if (o.second.count > 0) closed.push_back(o.second);
  std::stable_sort(closed.begin(), closed.end(), [](const Bucket& a, const Bucket& b) { return a.first < b.first; });
  std::vector<int64_t> flats;
  for (const auto& b : closed) flats.push_back(b.count > 1 ? b.bytes : 0);
  return flats;
}

std::vector<int64_t> ddp_bucket_bytes(const std::vector<int64_t>& param_numels, int64_t bucket_cap_bytes) {
  std::vector<int64_t> param_bytes;
  for (int64_t n : param_numels) param_bytes.push_back(4 * n);  // fp32 parameters
  std::vector<int64_t> buckets;
  for (const std::vector<int>& members : spec::assign_buckets_by_size(param_bytes, bucket_cap_bytes)) {
    int64_t bytes = 0;
    for (int i : members) bytes += param_bytes[i];
    buckets.push_back(bytes);
  }
  return buckets;
}

std::vector<int64_t> ddp_rebuild_sync_tensors(const std::vector<int64_t>& param_numels, size_t buckets) {
  const int64_t indices = 4 * (static_cast<int64_t>(param_numels.size()) + 1);
  const int64_t sizes = 4 * static_cast<int64_t>(buckets);
  return {indices, indices, sizes, sizes};
}

int64_t ddp_rebuild_sync_bytes(const std::vector<int64_t>& param_numels, int64_t bucket_cap_bytes) {
  int64_t total = 0;
  for (int64_t b : ddp_rebuild_sync_tensors(param_numels, ddp_bucket_bytes(param_numels, bucket_cap_bytes).size()))
    total += b;
  return total;
}

std::vector<std::vector<int>> zero_redundancy_partition(const std::vector<int64_t>& numels, int world_size) {
  if (world_size < 1) throw std::invalid_argument("world size must be at least 1");
  std::vector<int> order(numels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return numels[a] > numels[b]; });
  std::vector<std::vector<int>> out(world_size);
  std::vector<int64_t> sizes(world_size, 0);
  for (int p : order) {
    const int r = static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    out[r].push_back(p);
    sizes[r] += numels[p];
  }
  return out;
}

}  // namespace shardfit::planner
