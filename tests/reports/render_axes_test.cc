// The report's charts read at any size: round tick values, x labels that do
// not crowd however many phases a run has, the prediction drawn over every
// step measured, the plan's table as a table, no "0 tokens/s".
#include "reports/render_axes.h"

#include <gtest/gtest.h>

#include <string>

#include "reports/render.h"
#include "tests/reports/text_count.h"

namespace shardfit::reports {
namespace {

TEST(RenderAxes, TicksAreOneTwoOrFiveTimesAPowerOfTen) {
  Ticks t = nice_ticks(0, 4.67);  // MiB: 0, 1, ..., 5
  EXPECT_DOUBLE_EQ(t.step, 1);
  EXPECT_DOUBLE_EQ(t.lo, 0);
  EXPECT_DOUBLE_EQ(t.hi, 5);
  EXPECT_EQ(t.values().size(), 6u);
  t = nice_ticks(0, 23100);  // 24 GiB in MiB: steps of 5000
  EXPECT_DOUBLE_EQ(t.step, 5000);
  EXPECT_DOUBLE_EQ(t.hi, 25000);
  t = nice_ticks(5.08, 6.31, 4);  // a loss curve: 5, 5.5, ..., 6.5
  EXPECT_DOUBLE_EQ(t.step, 0.5);
  EXPECT_DOUBLE_EQ(t.lo, 5);
  EXPECT_DOUBLE_EQ(t.hi, 6.5);
  t = nice_ticks(3, 3);  // a flat line still gets an axis
  EXPECT_GT(t.hi, t.lo);
}

std::vector<TimelinePoint> run_of(int steps, int units) {
  std::vector<TimelinePoint> t(1);
  t[0].label = "init";
  for (int s = 1; s <= steps; ++s) {
    for (const char* phase : {"forward", "backward"})
      for (int u = 0; u < units; ++u) {
        TimelinePoint p;
        p.label = "step" + std::to_string(s) + "/" + phase + "/transformer.h." + std::to_string(u);
        t.push_back(p);
      }
    TimelinePoint p;
    p.label = "step" + std::to_string(s) + "/optimizer";
    t.push_back(p);
  }
  return t;
}

TEST(RenderAxes, FewPhasesLabelEachManyLabelEachStepAtMostSixteen) {
  const auto few = x_labels(run_of(1, 2));  // 6 points
  ASSERT_EQ(few.size(), 6u);
  EXPECT_EQ(few[1].second, "step1/forward/transformer.h.0");
  const auto six = x_labels(run_of(6, 2));  // 31 points: init and a label per step
  ASSERT_EQ(six.size(), 7u);
  EXPECT_EQ(six[0].second, "init");
  EXPECT_EQ(six[1].second, "step 1");
  EXPECT_EQ(six[1].first, 1u);
  EXPECT_EQ(six[6].second, "step 6");
  EXPECT_EQ(six[6].first, 26u);
  const auto long_run = x_labels(run_of(200, 2));
  EXPECT_LE(long_run.size(), 16u);
  EXPECT_GE(long_run.size(), 8u);
}

TEST(RenderAxes, PredictionRepeatsStepTwoOverEveryMeasuredStep) {
  MemoryFigures p;
  p.timeline = run_of(2, 1);
  for (size_t i = 0; i < p.timeline.size(); ++i) {
    p.timeline[i].allocated_bytes = static_cast<int64_t>(100 + i);
    p.timeline_category_bytes.push_back({{"params", static_cast<int64_t>(i)}});
  }
  const MemoryFigures six = extend_steady_state(p, 6);
  ASSERT_EQ(six.timeline.size(), 1u + 6 * 3);
  ASSERT_EQ(six.timeline_category_bytes.size(), six.timeline.size());
  EXPECT_EQ(six.timeline[17].label, "step6/backward/transformer.h.0");
  EXPECT_EQ(six.timeline[17].allocated_bytes, p.timeline[5].allocated_bytes);  // step 2's backward
  EXPECT_EQ(six.timeline_category_bytes[17], p.timeline_category_bytes[5]);
  EXPECT_EQ(extend_steady_state(p, 2).timeline.size(), p.timeline.size());
  EXPECT_EQ(extend_steady_state(p, 0).timeline.size(), p.timeline.size());
  MemoryFigures one_step;
  one_step.timeline = run_of(1, 1);
  EXPECT_EQ(extend_steady_state(one_step, 6).timeline.size(), one_step.timeline.size());
}

RunReport six_step_report() {
  RunReport r;
  r.candidate = "zero3/fp32/wrap=block";
  r.model = {{"name", "gpt2-tiny"}, {"params", 1000}, {"seq_len", 16}};
  r.hardware = {{"profile", "cpu"}, {"device_mem_bytes", 5 << 20}, {"gpus_per_node", 1}, {"nodes", 1}};
  r.batch_per_gpu = 2;
  r.steps = 6;
  r.loss = {6.2, 6.1, 6.0, 5.9, 5.8, 5.7};
  RankReport k;
  k.measured.timeline = run_of(6, 2);
  MemoryFigures predicted;
  predicted.timeline = run_of(2, 2);
  for (size_t i = 0; i < predicted.timeline.size(); ++i) {
    predicted.timeline[i].allocated_bytes = int64_t{1} << 20;
    predicted.timeline_category_bytes.push_back({{"params", int64_t{1} << 20}});
  }
  for (auto& p : k.measured.timeline) p.allocated_bytes = int64_t{1} << 20;
  k.predicted = predicted;
  r.ranks.push_back(k);
  return r;
}

TEST(ReportHtml, ChartsCoverEveryStepWithReadableAxes) {
  const RunReport r = six_step_report();
  const std::string timeline = render_timeline_svg(r);
  // Labels per step, not per phase; round MiB ticks up to the 5 MiB budget.
  EXPECT_EQ(count(timeline, "rotate(35"), 7u) << timeline;
  EXPECT_NE(timeline.find(">step 6</text>"), std::string::npos);
  EXPECT_NE(timeline.find("text-anchor='end'>6</text>"), std::string::npos) << timeline;  // 0, 2, 4, 6
  EXPECT_NE(timeline.find("predicted from step 3 on: step 2's"), std::string::npos);
  EXPECT_NE(timeline.find("predicted (= measured, lines coincide)"), std::string::npos);
  // The class chart runs to step 6 too: a tooltip per phase.
  const std::string classes = render_breakdown_svg(r);
  EXPECT_EQ(count(classes, "<circle"), r.ranks[0].measured.timeline.size());
  EXPECT_NE(classes.find("step6/optimizer: 1.00 MiB"), std::string::npos) << classes;
}

TEST(ReportHtml, PlanIsATableAndAnUntimedRunSaysSo) {
  RunReport r = six_step_report();
  r.tokens_per_s = 0;
  RenderOptions opt;
  opt.plan_title = "gpt2-tiny, seq len 16; chosen (*): ddp/fp32/wrap=none";
  opt.plan_rows = {{"", "candidate", "max batch/GPU"}, {"*", "ddp/fp32/wrap=none", "7"}, {"", "zero3/fp32/wrap=block", "9"}};
  const std::string html = render_html(r, opt);
  EXPECT_NE(html.find("<h2>Plan</h2>"), std::string::npos);
  EXPECT_NE(html.find("<td>*</td><td>ddp/fp32/wrap=none</td><td>7</td>"), std::string::npos) << html;
  EXPECT_EQ(html.find("<pre>"), std::string::npos);
  EXPECT_NE(html.find("not timed"), std::string::npos);
  EXPECT_EQ(html.find("0 tokens/s"), std::string::npos);
  const std::string md = render_markdown(r, opt);
  EXPECT_NE(md.find("| * | ddp/fp32/wrap=none | 7 |"), std::string::npos) << md;
}

}  // namespace
}  // namespace shardfit::reports
