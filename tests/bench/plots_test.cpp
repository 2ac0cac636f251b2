// The report's plots (src/bench/plots.cpp): the gnuplot inputs hold exactly the table's figures,
// gnuplot turns them into PNGs, and a missing or failing gnuplot becomes a note, never an error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/plots.h"

using tandem::bench::Analysis;
using tandem::bench::draw_plots;
using tandem::bench::plot_inputs;
using tandem::bench::Results;
using tandem::bench::Row;
using tandem::bench::Stat;

namespace {

Stat stat(double median, double min, double max) { return Stat{median, min, max, 3}; }
Stat exact(double v) { return stat(v, v, v); }

// Two models; Tandem single/ddp/dp-replicate and PyTorch single/ddp at worlds 1 and 2. "large" is
// "small" at a tenth of the throughput, and its PyTorch DDP row has no memory figure. Small's
// dp-replicate has a negative "other" (drawn at 0).
Row row(const std::string& model, const std::string& impl, const std::string& strategy, int world, double scale) {
  Row r;
  r.model = model;
  r.impl = impl;
  r.strategy = strategy;
  r.world = world;
  r.params = model == "small" ? 1200000 : 45000000;
  r.batch_per_device = model == "small" ? 64 : 8;
  r.mem_kind = "rss";
  const bool tandem = impl == "tandem";
  if (strategy == "single") {
    r.samples_per_s = stat((tandem ? 1000 : 900) * scale, (tandem ? 950 : 880) * scale, (tandem ? 1040 : 910) * scale);
    r.mem_primary_MB = exact(tandem ? 100.5 : 130.25);
    r.compute_ms = exact(64);
    r.other_ms = exact(0);
  } else if (strategy == "ddp") {
    r.samples_per_s = stat((tandem ? 1625.5 : 1500.25) * scale, (tandem ? 1600 : 1490) * scale, (tandem ? 1700 : 1510) * scale);
    r.mem_primary_MB = stat(tandem ? 110.75 : 140, tandem ? 110 : 139, tandem ? 112 : 141);
    r.mem_others_MB = exact(tandem ? 108.5 : 138);
    r.compute_ms = exact(64);
    r.exposed_comm_ms = exact(tandem ? 8.25 : 9.5);
    r.other_ms = exact(tandem ? 6.5 : 7);
    if (!tandem && model == "large") r.mem_primary_MB = r.mem_others_MB = Stat{};
  } else {  // dp-replicate
    r.samples_per_s = stat(1200 * scale, 1150 * scale, 1250 * scale);
    r.mem_primary_MB = exact(180.5);
    r.mem_others_MB = exact(60.25);
    r.compute_ms = exact(64);
    r.other_ms = exact(model == "small" ? -2.5 : 3.75);
  }
  r.p50_ms = exact(r.compute_ms.median + (r.exposed_comm_ms.empty() ? 0 : r.exposed_comm_ms.median) + r.other_ms.median);
  return r;
}

Results fixed_results() {
  Results res;
  res.config.models = {"small", "large"};
  res.config.strategies = {"single", "dp-replicate", "ddp"};
  res.config.worlds = {1, 2};
  res.config.repeats = 3;
  res.config.threads = 1;
  res.config.device = "cpu";
  res.machine = {{"cores", 2}, {"cpu", "Test CPU"}};
  return res;
}

// The table's order (summarize): per model, Tandem's rows then PyTorch's, strategies in order.
Analysis fixed_analysis() {
  Analysis a;
  for (const auto& [model, scale] : std::vector<std::pair<std::string, double>>{{"small", 1.0}, {"large", 0.1}}) {
    a.rows.push_back(row(model, "tandem", "single", 1, scale));
    a.rows.push_back(row(model, "tandem", "dp-replicate", 2, scale));
    a.rows.push_back(row(model, "tandem", "ddp", 2, scale));
    a.rows.push_back(row(model, "pytorch", "single", 1, scale));
    a.rows.push_back(row(model, "pytorch", "ddp", 2, scale));
  }
  return a;
}

// A data file's blocks: the "# model=..." comment that opens each, and its rows' fields.
struct Block {
  std::string header;
  std::vector<std::vector<std::string>> rows;
};

std::vector<Block> blocks_of(const std::string& data) {
  std::vector<Block> out;
  std::istringstream in(data);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# model=", 0) == 0) {
      out.push_back(Block{line.substr(2), {}});
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    if (out.empty()) {
      ADD_FAILURE() << "data before a block header: " << line;
      continue;
    }
    std::istringstream fields(line);
    std::vector<std::string> row;
    for (std::string f; fields >> f;) row.push_back(f);
    out.back().rows.push_back(row);
  }
  return out;
}

using Table = std::vector<std::vector<std::string>>;

std::map<std::string, std::string> files_of(const tandem::bench::PlotInputs& in) {
  std::map<std::string, std::string> out;
  for (const auto& [path, content] : in.files) out[path] = content;
  return out;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

class TempDir {
 public:
  TempDir() {
    std::string pattern = std::filesystem::temp_directory_path().string() + "/tandem-plots-test-XXXXXX";
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sets an environment variable for one test, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool gnuplot_on_path() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

std::string read_prefix(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

std::string write_script(const std::string& dir, const std::string& name, const std::string& body) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

const std::string kPngSignature("\x89PNG\r\n\x1a\n", 8);

}  // namespace

TEST(PlotInputs, HasThreeScriptsAndTheirData) {
  const auto files = files_of(plot_inputs("/report", fixed_results(), fixed_analysis()));
  std::vector<std::string> names;
  for (const auto& [path, content] : files) {
    names.push_back(path);
    EXPECT_FALSE(content.empty()) << path;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"plots/breakdown.dat", "plots/breakdown.gp", "plots/memory.dat",
                                             "plots/memory.gp", "plots/throughput.dat", "plots/throughput.gp"}));
  for (const std::string name : {"throughput", "memory", "breakdown"}) {
    const std::string& gp = files.at("plots/" + name + ".gp");
    EXPECT_TRUE(contains(gp, "set terminal pngcairo noenhanced")) << name;
    EXPECT_TRUE(contains(gp, "set output '/report/" + name + ".png'")) << name;
    EXPECT_TRUE(contains(gp, "'/report/plots/" + name + ".dat' index 1")) << name;  // the second model's panel
    EXPECT_TRUE(contains(gp, "set multiplot layout 1,2")) << name;                   // one panel per model
    EXPECT_TRUE(contains(gp, "CPU, Gloo, 1 thread per rank, 2 cores")) << name;
    // The panels in the configuration's order.
    EXPECT_LT(gp.find("# panel: small"), gp.find("# panel: large")) << name;
  }
}

TEST(PlotInputs, ThroughputLinesStartAtTheSingleRun) {
  const auto files = files_of(plot_inputs("/report", fixed_results(), fixed_analysis()));
  const auto blocks = blocks_of(files.at("plots/throughput.dat"));
  // Per model: Tandem dp-replicate and ddp, PyTorch ddp; the single runs start each line.
  ASSERT_EQ(blocks.size(), 6u);
  EXPECT_EQ(blocks[0].header, "model=small impl=tandem strategy=dp-replicate (world 1: the single-device run)");
  EXPECT_EQ(blocks[0].rows, (Table{{"1", "1000", "950", "1040"}, {"2", "1200", "1150", "1250"}}));
  EXPECT_EQ(blocks[1].header, "model=small impl=tandem strategy=ddp (world 1: the single-device run)");
  EXPECT_EQ(blocks[1].rows, (Table{{"1", "1000", "950", "1040"}, {"2", "1625.5", "1600", "1700"}}));
  EXPECT_EQ(blocks[2].header, "model=small impl=pytorch strategy=ddp (world 1: the single-device run)");
  EXPECT_EQ(blocks[2].rows, (Table{{"1", "900", "880", "910"}, {"2", "1500.25", "1490", "1510"}}));
  EXPECT_EQ(blocks[4].header, "model=large impl=tandem strategy=ddp (world 1: the single-device run)");
  EXPECT_EQ(blocks[4].rows, (Table{{"1", "100", "95", "104"}, {"2", "162.55", "160", "170"}}));
  EXPECT_EQ(blocks[5].header, "model=large impl=pytorch strategy=ddp (world 1: the single-device run)");

  const std::string& gp = files.at("plots/throughput.gp");
  EXPECT_TRUE(contains(gp, "median over 3 repeats (bars: min..max)"));
  EXPECT_TRUE(contains(gp, "index 1 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 1.2 dt 1 lc rgb \"#0072B2\" "
                           "title \"Tandem ddp\""));  // solid
  EXPECT_TRUE(contains(gp, "index 2 using 1:2:3:4 with yerrorlines lw 2 pt 6 ps 1.2 dt 2 lc rgb \"#0072B2\" "
                           "title \"PyTorch ddp\""));  // dashed, DDP's colour
  EXPECT_TRUE(contains(gp, "set xtics (1, 2)"));
  EXPECT_TRUE(contains(gp, "small (1.2M parameters, batch 64 per device)"));
  EXPECT_TRUE(contains(gp, "large (45M parameters, batch 8 per device)"));
}

TEST(PlotInputs, MemoryAtTheWidestWorldSkipsRowsWithoutMemory) {
  const auto files = files_of(plot_inputs("/report", fixed_results(), fixed_analysis()));
  const auto blocks = blocks_of(files.at("plots/memory.dat"));
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].header, "model=small widest_world=2");
  EXPECT_EQ(blocks[0].rows, (Table{{"tandem", "single", "1", "100.5", "100.5", "100.5", "NaN", "NaN", "NaN"},
                                   {"tandem", "dp-replicate", "2", "180.5", "180.5", "180.5", "60.25", "60.25", "60.25"},
                                   {"tandem", "ddp", "2", "110.75", "110", "112", "108.5", "108.5", "108.5"},
                                   {"pytorch", "single", "1", "130.25", "130.25", "130.25", "NaN", "NaN", "NaN"},
                                   {"pytorch", "ddp", "2", "140", "139", "141", "138", "138", "138"}}));
  EXPECT_EQ(blocks[1].header, "model=large widest_world=2");
  ASSERT_EQ(blocks[1].rows.size(), 4u);  // no PyTorch DDP: it has no memory figure
  EXPECT_EQ(blocks[1].rows[3], (std::vector<std::string>{"pytorch", "single", "1", "130.25", "130.25", "130.25", "NaN",
                                                         "NaN", "NaN"}));

  const std::string& gp = files.at("plots/memory.gp");
  EXPECT_TRUE(contains(gp, "title 'device 0'"));
  EXPECT_TRUE(contains(gp, "title 'other devices (max)'"));
  EXPECT_TRUE(contains(gp, "set style histogram errorbars"));
  EXPECT_TRUE(contains(gp, "process RSS per rank"));
}

TEST(PlotInputs, BreakdownStacksTandemStrategiesAndSaysWhenItClamps) {
  const auto files = files_of(plot_inputs("/report", fixed_results(), fixed_analysis()));
  const auto blocks = blocks_of(files.at("plots/breakdown.dat"));
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].header, "model=small world=2");
  // strategy compute exposed other_drawn other_measured step
  EXPECT_EQ(blocks[0].rows, (Table{{"dp-replicate", "64", "0", "0", "-2.5", "61.5"},
                                   {"ddp", "64", "8.25", "6.5", "6.5", "78.75"}}));
  EXPECT_EQ(blocks[1].rows, (Table{{"dp-replicate", "64", "0", "3.75", "3.75", "67.75"},
                                   {"ddp", "64", "8.25", "6.5", "6.5", "78.75"}}));
  const std::string& gp = files.at("plots/breakdown.gp");
  EXPECT_TRUE(contains(gp, "set style histogram rowstacked"));
  EXPECT_TRUE(contains(gp, "index 0 using 4 title \"other (clamped at 0)\""));  // small clamped
  EXPECT_TRUE(contains(gp, "index 1 using 4 title \"other\""));                  // large did not
  EXPECT_TRUE(contains(gp, "other clamped at 0 where negative"));

  // Without a negative "other", nothing mentions clamping.
  Analysis a = fixed_analysis();
  for (auto& r : a.rows) {
    if (r.other_ms.median < 0) r.other_ms = exact(1);
  }
  const auto unclamped = files_of(plot_inputs("/report", fixed_results(), a));
  EXPECT_FALSE(contains(unclamped.at("plots/breakdown.gp"), "clamp"));
}

TEST(PlotInputs, QuotesPathsWithSpacesAndQuotes) {
  const auto files = files_of(plot_inputs("/tmp/my report/it's", fixed_results(), fixed_analysis()));
  const std::string& gp = files.at("plots/throughput.gp");
  EXPECT_TRUE(contains(gp, "set output '/tmp/my report/it''s/throughput.png'"));
  EXPECT_TRUE(contains(gp, "'/tmp/my report/it''s/plots/throughput.dat' index 0"));
}

TEST(PlotInputs, LeavesOutAPlotWithNothingToDraw) {
  Analysis a = fixed_analysis();
  for (auto& r : a.rows) r.mem_primary_MB = r.mem_others_MB = Stat{};
  const auto files = files_of(plot_inputs("/report", fixed_results(), a));
  EXPECT_EQ(files.count("plots/memory.gp"), 0u);
  EXPECT_EQ(files.count("plots/memory.dat"), 0u);
  EXPECT_EQ(files.count("plots/throughput.gp"), 1u);
  EXPECT_EQ(files.count("plots/breakdown.gp"), 1u);
  EXPECT_TRUE(plot_inputs("/report", fixed_results(), Analysis{}).files.empty());
}

TEST(PlotDraw, WritesThreePngs) {
  if (!gnuplot_on_path()) GTEST_SKIP() << "gnuplot is not on PATH";
  TempDir tmp;
  const std::string dir = tmp.path() + "/report with space's";
  std::filesystem::create_directories(dir);
  ScopedEnv no_override("TANDEM_GNUPLOT", "");
  const auto outcome = draw_plots(dir, fixed_results(), fixed_analysis());
  EXPECT_EQ(outcome.note, "");
  EXPECT_EQ(outcome.files, (std::vector<std::string>{"throughput.png", "memory.png", "breakdown.png"}));
  for (const auto& f : outcome.files) {
    const std::string path = dir + "/" + f;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    EXPECT_GT(std::filesystem::file_size(path), 1000u) << path;
    EXPECT_EQ(read_prefix(path, 8), kPngSignature) << path;
  }
  for (const std::string name : {"throughput", "memory", "breakdown"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/plots/" + name + ".gp")) << name;
    EXPECT_TRUE(std::filesystem::exists(dir + "/plots/" + name + ".dat")) << name;
  }
}

TEST(PlotDraw, NotesAPlotWithNothingToDraw) {
  if (!gnuplot_on_path()) GTEST_SKIP() << "gnuplot is not on PATH";
  TempDir tmp;
  ScopedEnv no_override("TANDEM_GNUPLOT", "");
  Analysis a = fixed_analysis();
  for (auto& r : a.rows) r.mem_primary_MB = r.mem_others_MB = Stat{};
  const auto outcome = draw_plots(tmp.path(), fixed_results(), a);
  EXPECT_EQ(outcome.files, (std::vector<std::string>{"throughput.png", "breakdown.png"}));
  EXPECT_EQ(outcome.note, "memory.png not drawn: no memory measured");
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/memory.png"));
}

TEST(PlotDraw, MissingGnuplotIsANote) {
  TempDir tmp;
  ScopedEnv missing("TANDEM_GNUPLOT", "/nonexistent");
  const auto outcome = draw_plots(tmp.path(), fixed_results(), fixed_analysis());
  EXPECT_TRUE(outcome.files.empty());
  EXPECT_TRUE(contains(outcome.note, "/nonexistent")) << outcome.note;
  EXPECT_TRUE(contains(outcome.note, "TANDEM_GNUPLOT")) << outcome.note;
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));  // nothing written
}

TEST(PlotDraw, GnuplotFailureIsANoteWithItsError) {
  TempDir tmp;
  // gnuplot's way of failing: the offending command, a caret, then the message; exit 1.
  const std::string fake = write_script(tmp.path(), "fake-gnuplot",
                                        "echo 'plot foo' >&2\necho '     ^' >&2\n"
                                        "echo \"\\\"$1\\\" line 7: undefined variable: foo\" >&2\nexit 1\n");
  ScopedEnv failing("TANDEM_GNUPLOT", fake);
  const std::string dir = tmp.path() + "/report";
  const auto outcome = draw_plots(dir, fixed_results(), fixed_analysis());
  EXPECT_TRUE(outcome.files.empty());
  EXPECT_TRUE(contains(outcome.note, "throughput.png not drawn: gnuplot failed (exit 1): \"" + dir +
                                         "/plots/throughput.gp\" line 7: undefined variable: foo"))
      << outcome.note;
  EXPECT_TRUE(contains(outcome.note, "breakdown.png not drawn")) << outcome.note;
}

TEST(PlotDraw, GnuplotWithoutAnImageIsANote) {
  TempDir tmp;
  const std::string fake = write_script(tmp.path(), "silent-gnuplot", "exit 0\n");
  ScopedEnv silent("TANDEM_GNUPLOT", fake);
  const auto outcome = draw_plots(tmp.path() + "/report", fixed_results(), fixed_analysis());
  EXPECT_TRUE(outcome.files.empty());
  EXPECT_TRUE(contains(outcome.note, "memory.png not drawn: gnuplot exited 0 but wrote no image")) << outcome.note;
}
