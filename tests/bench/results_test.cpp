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

TEST(Results, OldResultsWithoutABackendAreGlooAndNewOnesKeepTheirs) {
  // The fixture predates --backends: no "backend" anywhere, no "backends" in the config.
  const auto old = test::fixture();
  EXPECT_EQ(old.config.backends, (std::vector<std::string>{"gloo"}));
  for (const auto& r : old.runs) {
    const bool one_process = r.strategy == "single" || r.strategy == "dp" || r.strategy.rfind("dp-", 0) == 0;
    EXPECT_EQ(r.backend, one_process ? "" : "gloo") << r.impl << " " << r.strategy;
  }
  // A run on MPI, and its config, survive the round trip; the single run still names none.
  auto results = old;
  results.config.backends = {"gloo", "mpi"};
  results.config.sweep = true;
  results.config.sweep_min_bytes = 65536;
  for (auto r : old.runs) {
    if (r.impl == "tandem" && r.strategy == "ddp") {
      r.backend = "mpi";
      results.runs.push_back(r);
    }
  }
  results.failures.push_back({{"tandem", "small", "ddp", 2, "mpi"}, 1, "exit code 1"});
  const auto doc = to_json(results);
  EXPECT_EQ(doc["runs"].back()["backend"], "mpi");
  EXPECT_FALSE(doc["runs"][0].contains("backend")) << doc["runs"][0];  // single: no backend to name
  const auto back = results_from_json(doc, "memory");
  EXPECT_EQ(back.config.backends, (std::vector<std::string>{"gloo", "mpi"}));
  EXPECT_TRUE(back.config.sweep);
  EXPECT_EQ(back.config.sweep_min_bytes, 65536);
  EXPECT_EQ(back.runs.back().backend, "mpi");
  EXPECT_EQ(back.failures.back().measurement.backend, "mpi");
  // A record naming another engine is refused by name.
  auto bad = to_json(old.runs[1]);
  bad["backend"] = "nccl";
  EXPECT_THROW(
      try { run_from_record(bad); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown backend \"nccl\""), std::string::npos) << e.what();
        throw;
      },
      Error);
}

TEST(Results, AWorkerRecordOfAnotherSchemaIsRefused) {
  nlohmann::json record{{"record", "tandem-bench-run/0"}};
  EXPECT_THROW(run_from_record(record), Error);
}

}  // namespace
}  // namespace tandem::bench
