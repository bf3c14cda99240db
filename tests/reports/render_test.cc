// `shardfit report`'s HTML: the loss curve, the predicted memory by class
// over time, and a legend that says when predicted and measured coincide;
// the per-class timeline round-trips through the report JSON.
#include "reports/render.h"

#include <gtest/gtest.h>

#include <string>

#include "reports/run_report.h"
#include "tests/reports/text_count.h"

namespace shardfit::reports {
namespace {

// One predicted sample and its bytes by class.
void sample(MemoryFigures& f, const std::string& phase, int64_t params, int64_t activations) {
  TimelinePoint s;
  s.label = phase;
  s.allocated_bytes = params + activations;
  s.reserved_bytes = s.allocated_bytes;
  s.peak_allocated_bytes = s.allocated_bytes;
  f.timeline.push_back(s);
  f.timeline_category_bytes.push_back(
      {{"params", params}, {"grads", 0}, {"activations", activations}});
}

RunReport report(bool exact) {
  RunReport r;
  r.candidate = "zero3/fp32/wrap=block";
  r.model = {{"name", "gpt2-tiny"}, {"params", 1000}, {"seq_len", 16}};
  r.hardware = {
      {"profile", "cpu"}, {"device_mem_bytes", nullptr}, {"gpus_per_node", 2}, {"nodes", 1}};
  r.batch_per_gpu = 2;
  r.world_size = 2;
  r.backend = "gloo";
  r.device = "cpu";
  r.steps = 3;
  r.loss = {6.2, 5.9, 5.1};
  for (int rank = 0; rank < 2; ++rank) {
    RankReport k;
    k.rank = rank;
    MemoryFigures predicted;
    sample(predicted, "init", 1000, 0);
    sample(predicted, "step1/forward/root", 1000, 4000);
    sample(predicted, "step1/backward/root", 1000, 500);
    sample(predicted, "step1/optimizer", 1000, 0);
    predicted.peak_allocated_bytes = predicted.peak_reserved_bytes = 5000;
    k.predicted = predicted;
    k.measured = predicted;
    k.measured.timeline_category_bytes.clear();  // the meter has totals only
    k.peak_error_pct = 0.0;  // the same peak predicted and measured
    if (!exact)
      k.measured.timeline[1].allocated_bytes += 8, k.measured.timeline[1].peak_allocated_bytes += 8;
    r.ranks.push_back(k);
  }
  return r;
}

TEST(ReportHtml, HasTheLossCurve) {
  const std::string html = render_html(report(true));
  EXPECT_NE(html.find("<h2>Loss</h2>"), std::string::npos);
  const std::string svg = render_loss_svg(report(true));
  EXPECT_NE(svg.find("<polyline class='loss'"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 3u);  // a point per step
  EXPECT_NE(svg.find("step 1: loss 6.2000"), std::string::npos);
  RunReport none = report(true);
  none.loss.clear();
  EXPECT_EQ(render_loss_svg(none), "");
}

TEST(ReportHtml, HasTheMemoryBreakdownByClassOverTime) {
  const std::string html = render_html(report(true));
  EXPECT_NE(html.find("<h2>Predicted memory by class over time</h2>"), std::string::npos);
  const std::string svg = render_breakdown_svg(report(true));
  EXPECT_NE(svg.find("class='class-params'"), std::string::npos);
  EXPECT_NE(svg.find("class='class-activations'"), std::string::npos);
  EXPECT_EQ(svg.find("class='class-grads'"), std::string::npos);  // all zero: not drawn
  // Without per-class samples (an old report) there is no chart.
  RunReport old = report(true);
  for (auto& k : old.ranks) k.predicted->timeline_category_bytes.clear();
  EXPECT_EQ(render_breakdown_svg(old), "");
}

TEST(ReportHtml, LegendSaysWhenPredictedAndMeasuredCoincide) {
  const std::string exact = render_timeline_svg(report(true));
  EXPECT_EQ(count(exact, "predicted (= measured, lines coincide)"), 2u) << exact;
  const std::string off = render_timeline_svg(report(false));
  EXPECT_EQ(count(off, "lines coincide"), 0u);
  EXPECT_EQ(count(off, ">predicted</text>"), 2u);
}

TEST(ReportJson, PerClassTimelineRoundTrips) {
  const RunReport r = report(true);
  const RunReport back = report_from_json(to_json(r), "r.json");
  ASSERT_TRUE(back.ranks[0].predicted);
  ASSERT_EQ(back.ranks[0].predicted->timeline_category_bytes.size(), 4u);
  EXPECT_EQ(back.ranks[0].predicted->timeline_category_bytes[1].at("activations"), 4000);
  EXPECT_TRUE(back.ranks[0].measured.timeline_category_bytes.empty());
  nlohmann::json j = to_json(r);
  j["ranks"][0]["predicted"]["timeline"][0]["category_bytes"] = 3;
  EXPECT_THROW(report_from_json(j, "r.json"), std::invalid_argument);
}

// Byte counts are whole numbers that fit int64: a float such as 2.2e24 (which
// nlohmann would cast, undefined behaviour: fuzz_report found it) or an
// unsigned beyond 2^63-1 is bad input naming the field.
TEST(ReportJson, ByteCountsBeyondInt64OrFractionalAreRefused) {
  const RunReport r = report(true);
  for (const nlohmann::json& bad : {nlohmann::json(2.2e24), nlohmann::json(1.5),
                                    nlohmann::json(uint64_t{1} << 63)}) {
    nlohmann::json j = to_json(r);
    j["ranks"][0]["measured"]["peak_allocated_bytes"] = bad;
    try {
      report_from_json(j, "r.json");
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("peak_allocated_bytes"), std::string::npos) << e.what();
    }
    j = to_json(r);
    j["ranks"][0]["measured"]["breakdown_bytes"] = {{"params", bad}};
    EXPECT_THROW(report_from_json(j, "r.json"), std::invalid_argument) << bad.dump();
    for (const char* key : {"reserved_bytes", "peak_allocated_bytes"}) {
      j = to_json(r);
      j["ranks"][0]["predicted"]["timeline"][0][key] = bad;
      EXPECT_THROW(report_from_json(j, "r.json"), std::invalid_argument) << key << " " << bad.dump();
    }
    j = to_json(r);
    j["hardware"]["device_mem_bytes"] = bad;  // the renderer reads it as a number
    EXPECT_THROW(report_from_json(j, "r.json"), std::invalid_argument) << bad.dump();
  }
}

}  // namespace
}  // namespace shardfit::reports
