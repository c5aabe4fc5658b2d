// The capacity model and the load forecast on their own.
#include "planner/latency_model.h"

#include <cmath>

#include "gtest/gtest.h"
#include "planner/load_forecast.h"

namespace pdserve::planner {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TEST(LatencyModelTest, RecoversTheCurveFromPointsOnIt) {
  LatencyModel m;
  for (double x : {50.0, 100.0, 150.0, 180.0}) m.Add(kT0, x, 0.02 / (1 - x / 200));
  auto fit = m.Curve(kT0);
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->y0, 0.02, 1e-6);
  EXPECT_NEAR(fit->x_max, 200, 1e-3);
  EXPECT_NEAR(LatencyModel::CapacityAt(*fit, 0.08), 150, 1e-3);
  EXPECT_NEAR(LatencyModel::Predict(*fit, 100), 0.04, 1e-6);
  EXPECT_TRUE(std::isinf(LatencyModel::Predict(*fit, 250)));
  EXPECT_EQ(fit->max_observed_x, 180);
}

TEST(LatencyModelTest, OnePointWithTheLowestLatencySeenAsY0) {
  LatencyModel m;
  m.Add(kT0, 0, 0.5);  // idle: y0
  auto fit = m.Curve(kT0);
  ASSERT_TRUE(fit.has_value());
  EXPECT_TRUE(std::isinf(fit->x_max)) << "no load seen, no saturation known";
  m.Add(kT0, 100, 1.0);
  m.Add(kT0, 100, 1.0);
  m.Add(kT0, 100, 1.0);
  fit = m.Curve(kT0);
  ASSERT_TRUE(fit.has_value());
  EXPECT_GT(fit->x_max, 100);
  EXPECT_LT(fit->x_max, 1000);
}

TEST(LatencyModelTest, AFirstPointUnderOverloadIsNotTakenForTheIdleLatency) {
  LatencyModel m(LatencyModel::Options{.y0_ceiling = 0.5});
  m.Add(kT0, 450, 4.7);  // one prefill worker far over its SLO of 2 s
  auto fit = m.Curve(kT0);
  ASSERT_TRUE(fit.has_value());
  EXPECT_DOUBLE_EQ(fit->y0, 0.5);
  EXPECT_NEAR(fit->x_max, 450 / (1 - 0.5 / 4.7), 1e-6);
  // So a second worker is predicted to help.
  EXPECT_LT(LatencyModel::Predict(*fit, 225), 1.6);
}

TEST(LatencyModelTest, OldPointsFadeSoTheModelFollowsAChange) {
  LatencyModel m(LatencyModel::Options{.memory = absl::Minutes(1)});
  // The workers were twice as fast an hour ago.
  for (double x : {50.0, 150.0, 300.0}) m.Add(kT0, x, 0.02 / (1 - x / 400));
  const absl::Time later = kT0 + absl::Hours(1);
  for (double x : {50.0, 100.0, 150.0}) m.Add(later, x, 0.02 / (1 - x / 200));
  auto fit = m.Curve(later);
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->x_max, 200, 2);
}

TEST(LatencyModelTest, IgnoresNonsense) {
  LatencyModel m;
  m.Add(kT0, 10, std::nan(""));
  m.Add(kT0, -1, 0.1);
  m.Add(kT0, 10, 0);
  EXPECT_FALSE(m.Curve(kT0).has_value());
}

TEST(LoadForecastTest, FollowsATrendAndNeverGoesNegative) {
  LoadForecast f;
  EXPECT_FALSE(f.Forecast(absl::Seconds(10)).has_value());
  for (int i = 0; i < 30; ++i) f.Add(kT0 + absl::Seconds(10 * i), 100 + 10 * i);
  // 10 per 10 s = 1/s; the last value is 390; 60 s ahead ~ 450.
  EXPECT_NEAR(f.trend_per_s(), 1.0, 0.05);
  EXPECT_NEAR(*f.Forecast(absl::Seconds(60)), 450, 10);
  LoadForecast down;
  for (int i = 0; i < 30; ++i) down.Add(kT0 + absl::Seconds(10 * i), std::max(0, 300 - 20 * i));
  EXPECT_GE(*down.Forecast(absl::Seconds(600)), 0);
}

}  // namespace
}  // namespace pdserve::planner
