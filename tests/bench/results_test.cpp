// results.json: the schema round trip, and the refusals that name the file and the field.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>

#include "bench/report.h"
#include "fixture.h"
#include "tandem/error.h"

namespace tandem::bench {
namespace {

std::string temp_dir() {
  char name[] = "/tmp/tandem-bench-test-XXXXXX";
  EXPECT_NE(::mkdtemp(name), nullptr);
  return name;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Results, RoundTripKeepsEveryMeasurement) {
  const auto original = test::fixture();
  ASSERT_EQ(original.runs.size(), 19u);  // 9 per repeat, and the unsupported torch.nn.DataParallel
  const auto again = results_from_json(to_json(original), "memory");
  ASSERT_EQ(again.runs.size(), original.runs.size());
  for (size_t i = 0; i < original.runs.size(); ++i) {
    EXPECT_EQ(to_json(again.runs[i]), to_json(original.runs[i])) << i;
  }
  EXPECT_EQ(again.config.models, original.config.models);
  EXPECT_EQ(again.config.worlds, (std::vector<int>{1, 2}));
  EXPECT_EQ(again.config.batch_sizes.at("small"), 10);
  EXPECT_EQ(again.machine["cpu"], "Test CPU");
  EXPECT_EQ(again.runs.back().unsupported.substr(0, 21), "torch.nn.DataParallel");
}

TEST(Results, AReportReadsBackTheSameMeasurements) {
  const auto dir = temp_dir();
  const auto original = test::fixture();
  write_report(dir, original);
  const auto back = load_results(dir);
  EXPECT_EQ(to_json(back), to_json(original));
  // The derived sections are there for readers that do not recompute them.
  std::ifstream in(dir + "/results.json");
  const auto doc = nlohmann::json::parse(in);
  ASSERT_TRUE(doc.contains("derived"));
  EXPECT_EQ(doc["derived"]["recommendations"][0]["strategy"], "ddp");
  EXPECT_DOUBLE_EQ(doc["derived"]["rows"][0]["samples_per_s"]["median"].get<double>(), 90);
}

TEST(Results, RefusesWhatItCannotRead) {
  const auto dir = temp_dir();
  EXPECT_THROW(
      try { load_results(dir); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no results.json there"), std::string::npos) << e.what();
        throw;
      },
      Error);
  write(dir + "/results.json", "{ not json");
  EXPECT_THROW(
      try { load_results(dir); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("is not valid JSON"), std::string::npos) << e.what();
        throw;
      },
      Error);
  auto doc = to_json(test::fixture());
  doc["schema"] = "tandem-bench/99";
  EXPECT_THROW(
      try { results_from_json(doc, "x.json"); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("x.json has schema \"tandem-bench/99\""), std::string::npos) << e.what();
        throw;
      },
      Error);
  doc = to_json(test::fixture());
  doc["runs"][3].erase("p50_s");
  EXPECT_THROW(
      try { results_from_json(doc, "x.json"); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("runs[3]: the worker's record: the field \"p50_s\" is missing"),
                  std::string::npos) << e.what();
        throw;
      },
      Error);
  doc = to_json(test::fixture());
  doc["runs"][0]["world"] = "two";
  EXPECT_THROW(results_from_json(doc, "x.json"), Error);
}

TEST(Results, AWorkerRecordOfAnotherSchemaIsRefused) {
  nlohmann::json record{{"record", "tandem-bench-run/0"}};
  EXPECT_THROW(run_from_record(record), Error);
}

}  // namespace
}  // namespace tandem::bench
