// `tandem plan`: which configurations of a model fit the hardware, and how fast each is, before
// anything is launched (src/plan/, docs/guide-plan.md).
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "plan/report.h"
#include "plan/search.h"
#include "plan/validate.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace {

struct PlanFlags {
  std::string model, arch = "gpt", profile, precision, optimizer = "adam", out, validate, show_profile,
      fit_profile;
  int64_t layers = 0, dim = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0, batch = 0;
  int nodes = 0, devices_per_node = 0, top = 10;
  plan::SearchSpace sizes;
  std::vector<std::string> checkpointing{"none", "full"};
  double memory_gib = 0;
  bool json = false, no_sequence_parallel = false;
};

plan::Model model_of(const PlanFlags& f) {
  const bool by_dims = f.layers || f.dim || f.heads || f.vocab || f.seq || f.ffn || f.kv_heads;
  TANDEM_CHECK(!f.model.empty() || by_dims, "give --model NAME, or a transformer's --layers, --dim, --heads, --vocab and --seq");
  plan::Model m;
  if (!f.model.empty()) {
    m = plan::model_by_name(f.model);
    if (f.seq) m.seq = f.seq;  // a named model at another sequence length
    TANDEM_CHECK(!(f.layers || f.dim || f.heads || f.vocab || f.ffn || f.kv_heads), "--model ", f.model,
                 " has its dimensions; give only --seq to change its sequence length");
  } else {
    TANDEM_CHECK(f.arch == "gpt" || f.arch == "llama", "--arch: gpt or llama (got ", f.arch, ")");
    m.name = "custom";
    m.arch = f.arch == "gpt" ? plan::Arch::Gpt : plan::Arch::Llama;
    m.layers = f.layers, m.dim = f.dim, m.heads = f.heads, m.vocab = f.vocab, m.seq = f.seq;
    m.kv_heads = f.kv_heads ? f.kv_heads : f.heads;
    m.ffn = f.ffn ? f.ffn : 4 * f.dim;
  }
  plan::check_model(m);
  return m;
}

nlohmann::json frontier_results(const std::string& flag, const std::string& dir) {
  std::ifstream in(dir + "/results.json");
  TANDEM_CHECK(in.good(), flag, " ", dir, ": no results.json there (a tandem bench --memory-budget --out DIR)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception&) {
    throw Error(flag + " " + dir + ": results.json is not JSON");
  }
}

int run_plan(const PlanFlags& f) {
  if (!f.show_profile.empty()) {
    std::printf("%s\n", plan::profile_json(plan::load_profile(f.show_profile)).dump(2).c_str());
    return 0;
  }
  const bool measured = !f.validate.empty() || !f.fit_profile.empty();  // the frontier's CPU probes
  plan::Profile profile = plan::load_profile(!f.profile.empty() ? f.profile : measured ? "cpu" : "h100-8x");
  if (f.nodes) profile.nodes = f.nodes;
  if (f.devices_per_node) profile.devices_per_node = f.devices_per_node;
  plan::check_devices(profile, "--nodes and --devices-per-node");
  TANDEM_CHECK(f.memory_gib <= 1e6, "--memory ", f.memory_gib, " GiB per device is not a device's memory");
  if (f.memory_gib > 0) profile.memory_bytes = static_cast<int64_t>(f.memory_gib * 1024 * 1024 * 1024);
  TANDEM_CHECK(profile.memory_bytes > profile.runtime_bytes, "--memory ", f.memory_gib,
               " GiB is less than the runtime's own memory on ", profile.name);
  if (!f.validate.empty()) {
    std::printf("%s", plan::validation_table(plan::validate_frontier(frontier_results("--validate", f.validate), profile))
                          .c_str());
    return 0;
  }
  if (!f.fit_profile.empty()) {
    std::printf("%s\n", plan::profile_json(plan::fit_cpu_profile(frontier_results("--fit-profile", f.fit_profile),
                                                                 plan::load_profile("cpu")))
                            .dump(2)
                            .c_str());
    return 0;
  }
  plan::Job job;
  job.model = model_of(f);
  job.profile = profile;
  job.precision = !f.precision.empty() ? f.precision : profile.bf16_flops > 0 ? "bf16" : "fp32";
  job.global_batch = f.batch ? f.batch : profile.devices();
  job.optimizer = f.optimizer;
  plan::SearchSpace space = f.sizes;
  space.sequence_parallel = !f.no_sequence_parallel;
  space.checkpointing.clear();
  for (const auto& c : f.checkpointing) space.checkpointing.push_back(plan::parse_checkpointing(c));
  const std::vector<plan::Estimate> estimates = plan::plan_all(job, space);
  if (f.json) {
    for (const auto& e : estimates) std::printf("%s\n", plan::estimate_json(e).dump().c_str());
    return 0;
  }
  std::printf("%s\n%s", plan::describe_job(job).c_str(), plan::plan_table(job, estimates, f.top).c_str());
  if (!f.out.empty()) {
    ::mkdir(f.out.c_str(), 0755);
    std::ofstream md(f.out + "/plan.md"), jsonl(f.out + "/plan.jsonl");
    TANDEM_CHECK(md.good() && jsonl.good(), "--out ", f.out, ": cannot write there");
    md << "# tandem plan\n\n" << plan::describe_job(job) << "\n" << plan::plan_table(job, estimates, f.top)
       << "\n![memory per rank](plan.png)\n";
    for (const auto& e : estimates) jsonl << plan::estimate_json(e).dump() << "\n";
    const std::string note = plan::draw_plan_plot(f.out, job, estimates, f.top);
    std::printf("\ntandem plan: wrote %s/plan.md %s/plan.jsonl%s\n", f.out.c_str(), f.out.c_str(),
                note.empty() ? (" " + f.out + "/plan.png").c_str() : ("; no plot: " + note).c_str());
  }
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Predict every DDP/ZeRO/FSDP/HSDP/TP/PP configuration's memory and step time for a model on given "
              "hardware, without running it");
  sub->add_option("--model", flags->model, "llama3-8b, llama3-70b, llama3-405b, gpt-cpu-0 .. gpt-cpu-15, gpt-tiny-0 .. gpt-tiny-5");
  sub->add_option("--arch", flags->arch, "the block design of a model given by dimensions: gpt or llama")->capture_default_str();
  sub->add_option("--layers", flags->layers, "transformer blocks")->check(CLI::PositiveNumber);
  sub->add_option("--dim", flags->dim, "model width")->check(CLI::PositiveNumber);
  sub->add_option("--heads", flags->heads, "attention heads")->check(CLI::PositiveNumber);
  sub->add_option("--kv-heads", flags->kv_heads, "key/value heads (default: --heads)")->check(CLI::PositiveNumber);
  sub->add_option("--ffn", flags->ffn, "FFN hidden size (default: 4 x --dim)")->check(CLI::PositiveNumber);
  sub->add_option("--vocab", flags->vocab, "vocabulary")->check(CLI::PositiveNumber);
  sub->add_option("--seq", flags->seq, "sequence length (with --model: overrides its own)")->check(CLI::PositiveNumber);
  sub->add_option("--batch", flags->batch, "sequences per optimizer step across the job (default: one per device)")->check(CLI::PositiveNumber);
  sub->add_option("--precision", flags->precision, "bf16 (mixed, float32 master weights) or fp32 (default: bf16 where "
                                                   "the profile has a bf16 rate)");
  sub->add_option("--optimizer", flags->optimizer, "adam, or sgd (with momentum)")->capture_default_str();
  sub->add_option("--profile", flags->profile,
                  "h100-8x, h200-8x, a100-8x, cpu, or a JSON file (default: h100-8x; cpu with --validate)");
  sub->add_option("--nodes", flags->nodes, "nodes (default: the profile's)")->check(CLI::PositiveNumber);
  sub->add_option("--devices-per-node", flags->devices_per_node, "devices per node (default: the profile's)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--memory", flags->memory_gib, "GiB per device (default: the profile's)")->check(CLI::PositiveNumber);
  sub->add_option("--dp", flags->sizes.dp, "only this data-parallel size")->check(CLI::PositiveNumber);
  sub->add_option("--tp", flags->sizes.tp, "only this tensor-parallel size")->check(CLI::PositiveNumber);
  sub->add_option("--pp", flags->sizes.pp, "only this pipeline size")->check(CLI::PositiveNumber);
  sub->add_option("--checkpointing", flags->checkpointing,
                  "what backward may recompute, tried in turn: none, full (every block), selective (torchtitan's "
                  "per-op policy, for comparison: Tandem checkpoints whole blocks)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("--no-sequence-parallel", flags->no_sequence_parallel,
                "tensor parallelism without tp::SequenceParallel: the norms' activations whole on every TP rank");
  sub->add_option("--top", flags->top, "configurations shown in the table")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_flag("--json", flags->json, "one JSON object per configuration, one per line, and nothing else");
  sub->add_option("--out", flags->out, "also write DIR/plan.md, plan.jsonl and plan.png");
  sub->add_option("--show-profile", flags->show_profile, "print a profile as JSON (a file to edit) and exit");
  sub->add_option("--validate", flags->validate,
                  "compare the plan with a tandem bench --memory-budget run's measured peaks and tokens/s (its --out "
                  "DIR)");
  sub->add_option("--fit-profile", flags->fit_profile,
                  "print a CPU profile fitted to a tandem bench --memory-budget run's DDP probes (its --out DIR), "
                  "to plan this machine with --profile FILE");
  return [flags] { return run_plan(*flags); };
}

}  // namespace tandem::cli
