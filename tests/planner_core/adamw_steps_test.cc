// AdamW's steps composed for other parameter lists (planner/adamw_steps.h),
// on hand-made traces shaped as 1.13's steps record them, so that every
// figure below can be added up by hand.
#include "planner/adamw_steps.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace shardfit::planner {
namespace {

enum Op { kEmpty = 0, kAdd = 1, kEmptyStrided = 2, kForeachMul = 3, kForeachAdd = 4 };

struct Builder {
  ModelTrace t;
  int64_t next = 1;
  Builder() { t.op_names = {"aten::empty", "aten::add_", "aten::empty_strided", "aten::_foreach_mul_",
                            "aten::_foreach_add"}; }
  int64_t alloc(int64_t bytes, int op) {
    MemEvent e;
    e.kind = MemEvent::kAlloc;
    e.tensor = next;
    e.bytes = bytes;
    e.op = op;
    t.events.push_back(e);
    return next++;
  }
  void free(int64_t tensor, int op = -1) {
    MemEvent e;
    e.kind = MemEvent::kFree;
    e.tensor = tensor;
    e.op = op;
    t.events.push_back(e);
  }
};

// AdamW(foreach=True)'s first step on a CPU target over parameters of these
// bytes, as 1.13 records it: the record_function's 4 B; each parameter's
// state (its 4 B `step`, exp_avg, exp_avg_sq); each `step` tensor's add_
// (an 8 B transient per tensor); _foreach_mul_'s 12 B; the sqrt of every
// exp_avg_sq; _foreach_add's 12 B around every denominator; the return.
ModelTrace first_step(const std::vector<int64_t>& params) {
  Builder b;
  b.free(b.alloc(4, kEmpty));
  for (int64_t p : params) {
    b.alloc(4, kEmpty);
    b.alloc(p, kEmptyStrided);
    b.alloc(p, kEmptyStrided);
  }
  for (size_t i = 0; i < params.size(); ++i) b.free(b.alloc(8, kAdd), kAdd);
  b.free(b.alloc(12, kEmpty), kForeachMul);
  std::vector<int64_t> outputs;
  for (int64_t p : params) outputs.push_back(b.alloc(p, kEmptyStrided));
  const int64_t x = b.alloc(12, kEmpty);
  for (int64_t p : params) outputs.push_back(b.alloc(p, kEmptyStrided));
  b.free(x, kForeachAdd);
  std::reverse(outputs.begin(), outputs.end());
  for (int64_t o : outputs) b.free(o);
  return b.t;
}

int64_t peak(const ModelTrace& t) {
  std::unordered_map<int64_t, int64_t> size;
  int64_t live = 0, top = 0;
  for (const MemEvent& e : t.events) {
    if (e.kind == MemEvent::kAlloc) top = std::max(top, live += size[e.tensor] = e.bytes);
    if (e.kind == MemEvent::kFree) live -= size.at(e.tensor);
  }
  return top;
}

TEST(MultiTensorAdamw, TheWholeListRebuildsTheTracedStep) {
  const ModelTrace traced = first_step({40, 8, 24});
  const MultiTensorAdamwStep split(traced, {40, 8, 24});
  const ModelTrace again = split.compose({{0, 40}, {1, 8}, {2, 24}});
  EXPECT_EQ(again.events.size(), traced.events.size());
  // The state (3 x 4 + 2 x 72 = 156), every sqrt (72), the 12 B, every
  // denominator (72): 312.
  EXPECT_EQ(peak(again), 312);
  EXPECT_EQ(peak(traced), 312);
}

TEST(MultiTensorAdamw, APartitionHoldsItsOwnParametersTemporariesOnly) {
  const MultiTensorAdamwStep split(first_step({40, 8, 24}), {40, 8, 24});
  // ZeroRedundancyOptimizer's rank holding parameters 2 and 0 (64 B): its
  // state 2 x 4 + 2 x 64 = 136, the sqrts 64, the call's 12 B once, the
  // denominators 64: 276.
  EXPECT_EQ(peak(split.compose({{2, 24}, {0, 40}})), 276);
  // Alone, parameter 1: 4 + 16, 8, 12, 8.
  EXPECT_EQ(peak(split.compose({{1, 8}})), 48);
}

TEST(MultiTensorAdamw, ShardsResizeTheParametersStorages) {
  const MultiTensorAdamwStep split(first_step({40, 8, 24}), {40, 8, 24});
  // Two FSDP shards of 400 B and 100 B, each parameter 0's part resized:
  // every 40 B storage takes the shard's size, its 4 B `step` stays:
  // 2 x 4 + 2 x 500, 500, 12, 500.
  EXPECT_EQ(peak(split.compose({{0, 400}, {0, 100}})), 2020);
  EXPECT_THROW(split.compose({{3, 8}}), std::invalid_argument);
}

TEST(MultiTensorAdamw, AStepThatDoesNotSplitIsRefusedInOneLine) {
  // Five storages returned for three parameters.
  ModelTrace t = first_step({40, 8, 24});
  t.events.erase(std::remove_if(t.events.begin(), t.events.end(),
                                [](const MemEvent& e) { return e.tensor == 17; }),
                 t.events.end());
  try {
    MultiTensorAdamwStep split(t, {40, 8, 24});
    FAIL() << "split";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--adamw-step foreach"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("5 returned"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MultiTensorAdamwStep(first_step({40}), {}), std::invalid_argument);
}

}  // namespace
}  // namespace shardfit::planner
