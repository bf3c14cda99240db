// shardfit.trace/1 (planner/trace_file.h, `plan --trace`): what is written
// reads back the same, and a malformed file is one line naming the field.
#include "planner/trace_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace shardfit::planner {
namespace {

using nlohmann::json;

std::string seed_text() {
  std::ifstream in(std::string(SHARDFIT_SOURCE_DIR) + "/tests/fuzz/corpus/trace_file/toy.json");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string error_of(const std::string& text) {
  try {
    parse_trace_file(text, "--trace t.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TraceFile, ReadsTheModuleTableAndEveryTrace) {
  const TraceFile f = parse_trace_file(seed_text(), "toy");
  EXPECT_EQ(f.model_name, "toy");
  EXPECT_EQ(f.seq_len, 4);
  EXPECT_FALSE(f.target_cuda);
  ASSERT_EQ(f.modules.size(), 2u);
  EXPECT_EQ(f.modules[1].params.at(0).name, "lin.weight");
  EXPECT_TRUE(f.modules[1].is_block);
  EXPECT_EQ(f.param_count(), 12);
  ASSERT_EQ(f.traces.size(), 3u);
  const ModelTrace* t2 = f.find(DType::kF32, {}, 2);
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(t2->events.size(), 10u);
  EXPECT_EQ(t2->events[2].kind, MemEvent::kAlloc);
  EXPECT_EQ(t2->events[2].bytes, 96);
  EXPECT_EQ(t2->events[2].op, 0);
  EXPECT_EQ(t2->events[4].phase, Phase::kBackward);
  EXPECT_EQ(f.find(DType::kBF16, {}, 1), nullptr);
  EXPECT_EQ(f.find(DType::kF32, {1}, 1), nullptr);
}

TEST(TraceFile, WhatIsWrittenReadsBackTheSame) {
  const TraceFile f = parse_trace_file(seed_text(), "toy");
  const TraceFile g = parse_trace_file(trace_file_json(f), "again");
  EXPECT_EQ(trace_file_json(g), trace_file_json(f));
}

TEST(TraceFile, TheBlockInputCastsReadBackAndANegativeCountIsNamed) {
  json j = json::parse(seed_text());
  EXPECT_EQ(parse_trace_file(j.dump(), "toy").block_input_casts, -1);  // not said
  j["block_input_casts"] = 0;
  const TraceFile f = parse_trace_file(j.dump(), "toy");
  EXPECT_EQ(f.block_input_casts, 0);
  EXPECT_EQ(parse_trace_file(trace_file_json(f), "again").block_input_casts, 0);
  j["block_input_casts"] = -2;
  EXPECT_NE(error_of(j.dump()).find("block_input_casts"), std::string::npos) << error_of(j.dump());
}

TEST(TraceFile, TheReturnedTensorsReadBackAndANegativeSizeIsNamed) {
  json j = json::parse(seed_text());
  j["traces"][0]["output_tensors"] = {4, 96};
  const TraceFile f = parse_trace_file(j.dump(), "toy");
  EXPECT_EQ(f.traces[0].output_tensor_bytes, (std::vector<int64_t>{4, 96}));
  EXPECT_EQ(trace_file_json(parse_trace_file(trace_file_json(f), "again")), trace_file_json(f));
  j["traces"][0]["output_tensors"] = {4, -1};
  EXPECT_NE(error_of(j.dump()).find("output_tensors"), std::string::npos) << error_of(j.dump());
}

TEST(TraceFile, TheWorkByOpReadsBackAndAnUnsortedKernelListIsNamed) {
  json j = json::parse(seed_text());
  const json phase = {{"gemms", {{1, 3, 4, 4}}}, {"kernels", {{"aten::add", 2, 96.0}, {"aten::gelu", 1, 48.0}}},
                      {"nodes", 0}};
  j["traces"][0]["work"] = {{"forward", phase}, {"backward", phase}};
  const TraceFile f = parse_trace_file(j.dump(), "toy");
  const PhaseWork& w = f.traces[0].forward_work;
  ASSERT_EQ(w.gemms.size(), 1u);
  EXPECT_TRUE(w.gemms[0] == (GemmShape{1, 3, 4, 4}));
  EXPECT_EQ(w.ops(), 3);
  EXPECT_EQ(w.kernels[1].op, "aten::gelu");
  EXPECT_TRUE(f.traces[1].forward_work.empty());  // optional: files before it have none
  EXPECT_EQ(trace_file_json(parse_trace_file(trace_file_json(f), "again")), trace_file_json(f));
  j["traces"][0]["work"]["forward"]["kernels"] = {{"aten::gelu", 1, 48.0}, {"aten::add", 2, 96.0}};
  EXPECT_NE(error_of(j.dump()).find("'traces[0].work.forward.kernels' must be sorted"), std::string::npos)
      << error_of(j.dump());
  j["traces"][0]["work"]["forward"]["gemms"] = {{1, 3, 4}};
  EXPECT_NE(error_of(j.dump()).find("gemms"), std::string::npos) << error_of(j.dump());
}

TEST(TraceFile, BuffersAndZeroGradReadBackAndABadBufferIsNamed) {
  json j = json::parse(seed_text());
  j["modules"][1]["buffers"] = {{{"name", "lin.mask"}, {"shape", {4, 4}}, {"dtype", "uint8"}, {"bytes", 16}},
                                {{"name", "lin.scale"}, {"shape", json::array()}, {"dtype", "float32"}, {"bytes", 4}}};
  j["optimizer"] = {{"name", "adamw"},
                    {"steps", {{{"op_names", json::array()}, {"events", json::array()}},
                               {{"op_names", json::array()}, {"events", json::array()}}}},
                    {"zero_grad", {{"op_names", json::array()},
                                   {"events", {{"alloc", "forward", 0, 1, 292, -1}, {"free", "forward", 0, 1, 0, -1}}}}}};
  const TraceFile f = parse_trace_file(j.dump(), "toy");
  ASSERT_EQ(f.buffers().size(), 2u);
  EXPECT_EQ(f.buffers()[0].name, "lin.mask");
  EXPECT_EQ(f.buffers()[1].bytes, 4);
  ASSERT_EQ(f.optimizer_zero_grad.events.size(), 2u);
  EXPECT_EQ(f.optimizer_zero_grad.events[0].bytes, 292);
  EXPECT_EQ(trace_file_json(parse_trace_file(trace_file_json(f), "again")), trace_file_json(f));

  j["modules"][1]["buffers"][0]["bytes"] = 17;
  EXPECT_EQ(error_of(j.dump()), "--trace t.json: field 'modules[1].buffers[0].bytes' is not its shape's elements "
                                "times the dtype's size");
  j["modules"][1]["buffers"][0]["dtype"] = "complex32";
  EXPECT_NE(error_of(j.dump()).find("field 'modules[1].buffers[0].dtype' 'complex32' is not a dtype"),
            std::string::npos);
}

// AdamW(foreach=True)'s two steps (plan --adamw-foreach) read back; any
// other number of them is named.
TEST(TraceFile, ForeachStepsReadBackAndMustBeTwo) {
  json j = json::parse(seed_text());
  const json step = {{"op_names", {"aten::_foreach_sqrt"}},
                     {"events", {{"alloc", "forward", 0, 1, 64, 0}, {"free", "forward", 0, 1, 0, 0}}}};
  j["optimizer"] = {{"name", "adamw"}, {"steps", {step, step}}, {"foreach_steps", {step, step}}};
  const TraceFile f = parse_trace_file(j.dump(), "toy");
  ASSERT_EQ(f.optimizer_foreach_steps.size(), 2u);
  EXPECT_EQ(f.optimizer_foreach_steps[1].events[0].bytes, 64);
  EXPECT_EQ(trace_file_json(parse_trace_file(trace_file_json(f), "again")), trace_file_json(f));
  j["optimizer"]["foreach_steps"] = {step};
  EXPECT_EQ(error_of(j.dump()), "--trace t.json: field 'optimizer.foreach_steps' must be a list of two steps (the "
                                "first, a later one)");
}

// A tied parameter names its owner, which comes earlier in the table: one
// that names no parameter is refused, not ignored.
TEST(TraceFile, ABorrowedParameterMustNameAnEarlierModulesParameter) {
  json j = json::parse(seed_text());
  j["modules"][1]["borrowed_params"] = {"no.such.weight"};
  EXPECT_EQ(error_of(j.dump()),
            "--trace t.json: field 'modules[1].borrowed_params' names 'no.such.weight', which no earlier module owns");
}

TEST(TraceFile, AnotherSchemaVersionIsRefusedByName) {
  json j = json::parse(seed_text());
  j["schema"] = "shardfit.trace/2";
  EXPECT_EQ(error_of(j.dump()),
            "--trace t.json: field 'schema' is 'shardfit.trace/2': this shardfit reads shardfit.trace/1 (record "
            "the trace again with this version's pytorch/trace_recorder.py)");
}

TEST(TraceFile, EventsThatCannotReplayAreRefusedNamingTheEvent) {
  json j = json::parse(seed_text());
  j["traces"][1]["events"][6] = {"free", "backward", 1, 99, 0, -1};
  EXPECT_EQ(error_of(j.dump()), "--trace t.json: field 'traces[1].events[6]' frees storage 99, which is not live");
  j = json::parse(seed_text());
  j["traces"][0]["events"][2][2] = 7;
  EXPECT_EQ(error_of(j.dump()), "--trace t.json: field 'traces[0].events[2]' names a module the file lacks");
  j = json::parse(seed_text());
  j["traces"][0]["events"][2][5] = 3;
  EXPECT_EQ(error_of(j.dump()), "--trace t.json: field 'traces[0].events[2]' names an op the trace lacks");
  // A size the planner would overflow when it scales the trace with the
  // batch ("allocation of -9223372036854775808 bytes") is named where it is.
  j = json::parse(seed_text());
  j["traces"][0]["events"][2][4] = int64_t{9223372036854775807};
  EXPECT_EQ(error_of(j.dump()),
            "--trace t.json: field 'traces[0].events[2]' allocates 9223372036854775807 bytes, above 2^40 (1 TiB)");
}

TEST(TraceFile, ParametersMustAddUpAndTracesMustNotRepeat) {
  json j = json::parse(seed_text());
  j["model"]["params"] = 13;
  EXPECT_EQ(error_of(j.dump()),
            "--trace t.json: field 'model.params' is not the sum of the modules' parameters (12)");
  j = json::parse(seed_text());
  j["traces"][2]["batch"] = 1;
  EXPECT_EQ(error_of(j.dump()),
            "--trace t.json: field 'traces[2].batch' repeats a trace already in the file (same batch, dtype, "
            "autocast, recompute, checkpoint and grads)");
  EXPECT_EQ(error_of("{"), "--trace t.json: not JSON (a shardfit.trace/1 file)");
}

}  // namespace
}  // namespace shardfit::planner
