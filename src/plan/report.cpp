#include "plan/report.h"

#include <cctype>
#include <cstdio>
#include <map>
#include <sstream>

#include "bench/plots.h"

namespace tandem::plan {

namespace {

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::string g(double bytes) { return fmt("%.2f", bytes / kGiB); }

// "needs 93.1 GiB per device, has 79.1 GiB" -> "needs more memory than a device has": the group.
std::string reason_group(const std::string& refusal) {
  if (refusal.rfind("needs ", 0) == 0) return "needs more memory than a device has";
  if (refusal.find("microbatches are fewer than") != std::string::npos) {
    return "fewer microbatches than pipeline stages (the Accelerator refuses it)";
  }
  if (refusal.find("over pipeline stages is not built") != std::string::npos) {
    return "ZeRO-1/2 over pipeline stages is not built (the Accelerator refuses it)";
  }
  if (refusal.find("over tensor-parallel pieces is not built") != std::string::npos) {
    return "ZeRO-1/2 over tensor-parallel pieces is not built (the Accelerator refuses it)";
  }
  std::string general;  // the sizes in the text vary between configurations: the reason does not
  for (size_t i = 0; i < refusal.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(refusal[i]))) {
      general += 'N';
      while (i + 1 < refusal.size() && std::isdigit(static_cast<unsigned char>(refusal[i + 1]))) ++i;
    } else {
      general += refusal[i];
    }
  }
  return general;
}

}  // namespace

std::string describe_job(const Job& job) {
  const Profile& p = job.profile;
  std::ostringstream s;
  s << "model " << job.model.name << ": " << job.model.describe() << "; batch " << job.global_batch
    << " sequences per step; " << job.precision << " with "
    << (job.optimizer == "adam" ? "Adam" : "SGD with momentum") << "\n"
    << "hardware " << p.name << ": " << p.nodes << " node(s) x " << p.devices_per_node << " " << p.device
    << " device(s), " << fmt("%.1f", static_cast<double>(p.memory_bytes) / kGiB) << " GiB each ("
    << p.description << ")\n";
  return s.str();
}

std::string plan_table(const Job& job, const std::vector<Estimate>& estimates, int top) {
  std::ostringstream s;
  s << "| # | configuration | peak GiB | weights | grads | optim | activ | buffers | runtime | step s | compute | "
       "exposed comm | bubble | tokens/s/device |\n"
    << "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  int shown = 0, fit = 0;
  for (const auto& e : estimates) {
    if (!e.fits()) continue;
    ++fit;
    if (shown >= top) continue;
    ++shown;
    const Memory& m = e.memory;
    s << "| " << shown << " | " << e.config.name() << " | " << g(m.total()) << " | " << g(m.weights) << " | "
      << g(m.gradients) << " | " << g(m.optimizer) << " | " << g(m.activations) << " | " << g(m.buffers) << " | "
      << g(m.runtime) << " | " << fmt("%.3f", e.time.step()) << " | " << fmt("%.3f", e.time.compute) << " | "
      << fmt("%.3f", e.time.exposed_comm) << " | " << fmt("%.3f", e.time.bubble) << " | "
      << fmt("%.0f", e.tokens_per_s_per_device) << " |\n";
  }
  if (fit == 0) s << "| - | nothing fits | | | | | | | | | | | | |\n";
  std::map<std::string, int> refused;
  const Estimate* closest = nullptr;
  for (const auto& e : estimates) {
    if (e.fits()) continue;
    ++refused[reason_group(e.refusal)];
    if (e.buildable && (!closest || e.memory.total() < closest->memory.total())) closest = &e;
  }
  s << "\n" << fit << " of " << estimates.size() << " configurations fit";
  if (fit > shown) s << " (the " << shown << " fastest shown; --top N or --json for all)";
  s << ".\n";
  for (const auto& [reason, count] : refused) s << "- refused " << count << ": " << reason << "\n";
  if (closest && fit == 0) {
    s << "- the closest: " << closest->config.name() << " " << closest->refusal << "\n";
  }
  if (job.profile.device == "cpu") {
    s << "- on a CPU, Tandem's FSDP and HSDP have measured 10-38 % above these peaks at tens of millions of "
         "parameters (the host allocator's heap, docs/benchmarks.md \"Planning\"): leave them that margin\n";
  }
  return s.str();
}

nlohmann::json estimate_json(const Estimate& e) {
  const Configuration& c = e.config;
  nlohmann::json j{{"configuration", c.name()}, {"sharding", c.sharding}, {"dp", c.dp},
                   {"shard", c.shard},          {"tp", c.tp}, {"sequence_parallel", c.sequence_parallel},             {"pp", c.pp},
                   {"checkpointing", c.checkpointing == Checkpointing::None        ? "none"
                                     : c.checkpointing == Checkpointing::Selective ? "selective"
                                                                                   : "full"}, {"microbatches", c.microbatches},
                   {"local_batch", c.local_batch}, {"fits", e.fits()}, {"refusal", e.refusal}};
  if (e.buildable) {
    const Memory& m = e.memory;
    j["memory_bytes"] = {{"total", m.total()},         {"weights", m.weights},   {"gradients", m.gradients},
                         {"optimizer", m.optimizer},   {"activations", m.activations}, {"buffers", m.buffers},
                         {"runtime", m.runtime}};
    j["step_s"] = {{"total", e.time.step()}, {"compute", e.time.compute}, {"exposed_comm", e.time.exposed_comm},
                   {"bubble", e.time.bubble}, {"comm", e.time.comm}};
    j["tokens_per_s_per_device"] = e.tokens_per_s_per_device;
  }
  return j;
}

std::string draw_plan_plot(const std::string& dir, const Job& job, const std::vector<Estimate>& estimates, int top) {
  bench::GnuplotPlot plot;
  plot.name = "plan";
  std::ostringstream data;
  data << "# configuration weights grads optimizer activations buffers runtime (GiB per rank)\n";
  int fits = 0, misses = 0;
  for (const auto& e : estimates) {
    if (!e.buildable) continue;
    if (e.fits() ? fits++ >= top : misses++ >= 3) continue;
    const Memory& m = e.memory;
    data << '"' << e.config.name() << (e.fits() ? "" : " (too big)") << "\" " << m.weights / kGiB << ' '
         << m.gradients / kGiB << ' ' << m.optimizer / kGiB << ' ' << m.activations / kGiB << ' ' << m.buffers / kGiB
         << ' ' << m.runtime / kGiB << "\n";
  }
  if (fits + misses == 0) return "nothing to plot: no configuration could be built";
  plot.data = data.str();
  const std::string dat = bench::gnuplot_path_literal(dir + "/plots/plan.dat");
  std::ostringstream gp;
  gp << "# tandem plan's memory per rank (run: gnuplot THIS_FILE)\n"
     << "set terminal pngcairo noenhanced size 1200,560 font 'sans,10'\n"
     << "set output " << bench::gnuplot_path_literal(dir + "/plan.png") << "\n"
     << "set title 'Peak memory per rank, " << job.model.name << " on " << job.profile.name
     << " (fastest first; the line: a device)'\n"
     << "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.8 border -1\n"
     << "set boxwidth 0.7\nset grid ytics\nset ylabel 'GiB'\nset xtics rotate by -35 nomirror\n"
     << "set key outside right top\nset yrange [0:*]\n"
     << "plot " << dat << " using 2:xtic(1) title 'weights', '' using 3 title 'gradients', '' using 4 title "
     << "'optimizer', '' using 5 title 'activations', '' using 6 title 'buffers', '' using 7 title 'runtime', "
     << static_cast<double>(job.profile.memory_bytes) / kGiB << " with lines lw 2 lc rgb 'black' title 'device memory'\n";
  plot.script = gp.str();
  const bench::PlotOutcome outcome = bench::draw_gnuplot_plots(dir, {plot});
  return outcome.note;
}

}  // namespace tandem::plan
