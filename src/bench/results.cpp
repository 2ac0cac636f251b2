#include "bench/results.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "common/durable_io.h"
#include "launch/gpu_count.h"
#include "tandem/error.h"

namespace tandem::bench {

using nlohmann::json;

namespace {

// Reads `key` of `object` as T, or throws naming where it came from.
template <typename T>
T field(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  TANDEM_CHECK(it != object.end(), where, ": the field \"", key, "\" is missing");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(message(where, ": the field \"", key, "\" has the wrong type (", it->type_name(), ")"));
  }
}

template <typename T>
T field_or(const json& object, const char* key, T fallback, const std::string& where) {
  return object.contains(key) ? field<T>(object, key, where) : fallback;
}

json measurement_json(const Measurement& m) {
  json j{{"impl", m.impl}, {"model", m.model}, {"strategy", m.strategy}, {"world", m.world}};
  if (!m.backend.empty()) j["backend"] = m.backend;
  return j;
}

Measurement measurement_from(const json& j, const std::string& where) {
  const auto strategy = field<std::string>(j, "strategy", where);
  return {field<std::string>(j, "impl", where), field<std::string>(j, "model", where), strategy,
          field<int>(j, "world", where), normal_backend(strategy, field_or<std::string>(j, "backend", "", where))};
}

std::string first_line_of(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      auto colon = line.find(':');
      auto value = colon == std::string::npos ? line : line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      return value;
    }
  }
  return "";
}

}  // namespace

Run run_from_record(const json& record) {
  const std::string where = "the worker's record";
  TANDEM_CHECK(record.is_object(), where, " is not a JSON object");
  const auto schema = field<std::string>(record, "record", where);
  TANDEM_CHECK(schema == kRunRecord, where, " has schema \"", schema, "\", this tandem reads \"", kRunRecord, "\"");
  Run r;
  r.impl = field<std::string>(record, "impl", where);
  r.model = field<std::string>(record, "model", where);
  r.strategy = field<std::string>(record, "strategy", where);
  r.backend = field_or<std::string>(record, "backend", "", where);
  TANDEM_CHECK(r.backend.empty() || r.backend == "gloo" || r.backend == "mpi", where, ": unknown backend \"",
               r.backend, "\" (expected gloo or mpi)");
  r.backend = normal_backend(r.strategy, r.backend);
  r.scale = field_or<std::string>(record, "scale", "", where);
  r.device = field_or<std::string>(record, "device", "cpu", where);
  r.precision = field_or<std::string>(record, "precision", "fp32", where);
  r.world = field<int>(record, "world", where);
  r.nodes = field_or<int>(record, "nodes", 1, where);
  r.repeat = field_or<int>(record, "repeat", 0, where);
  r.unsupported = field_or<std::string>(record, "unsupported", "", where);
  std::replace(r.unsupported.begin(), r.unsupported.end(), '\n', ' ');  // one list item in results.md
  if (record.contains("versions")) r.versions = record["versions"];
  if (!r.unsupported.empty()) return r;
  r.batch_per_device = field<int64_t>(record, "batch_per_device", where);
  r.steps = field_or<int>(record, "steps", 0, where);
  r.params = field<int64_t>(record, "params", where);
  r.grad_bytes = field<int64_t>(record, "grad_bytes", where);
  r.buckets = field_or<int>(record, "buckets", 0, where);
  r.bucket_bytes = field_or<std::vector<int64_t>>(record, "bucket_bytes", {}, where);
  r.p50_s = field<double>(record, "p50_s", where);
  r.p95_s = field<double>(record, "p95_s", where);
  r.forward_s = field_or<double>(record, "forward_p50_s", 0, where);
  r.backward_s = field_or<double>(record, "backward_p50_s", 0, where);
  r.optimizer_s = field_or<double>(record, "optimizer_p50_s", 0, where);
  r.peak_mem_bytes = field_or<std::vector<double>>(record, "peak_mem_bytes", {}, where);
  r.mem_kind = field_or<std::string>(record, "mem_kind", "", where);
  r.faults_per_step = field_or<std::vector<double>>(record, "rank_faults_per_step", {}, where);
  r.host_allocator = field_or<std::string>(record, "host_allocator", "", where);
  if (record.contains("model_state_bytes")) {
    for (const auto& rank : record["model_state_bytes"]) {
      const std::string in = where + " (model_state_bytes)";
      r.model_state.push_back({field<int64_t>(rank, "params", in), field<int64_t>(rank, "grads", in),
                               field<int64_t>(rank, "optimizer", in)});
    }
  }
  if (record.contains("step_transient_bytes")) {
    for (const auto& rank : record["step_transient_bytes"]) {
      const std::string in = where + " (step_transient_bytes)";
      r.step_transient.push_back({field<int64_t>(rank, "peak", in), field<int64_t>(rank, "two_largest_units", in)});
    }
  }
  r.exposed_gather_s = field_or<double>(record, "exposed_gather_p50_s", -1, where);
  r.exposed_reduce_scatter_s = field_or<double>(record, "exposed_reduce_scatter_p50_s", -1, where);
  r.tp_size = field_or<int>(record, "tp_size", 0, where);
  r.tp_comm_s = field_or<double>(record, "tp_comm_p50_s", -1, where);
  r.tp_comm_bytes = field_or<int64_t>(record, "tp_comm_bytes", -1, where);
  r.tp_collectives = field_or<int64_t>(record, "tp_collectives", -1, where);
  r.pp_schedule = field_or<std::string>(record, "pp_schedule", "", where);
  if (!r.pp_schedule.empty()) {
    r.pp_microbatches = field<int>(record, "pp_microbatches", where);
    r.pp_stages_per_rank = field<int>(record, "pp_stages_per_rank", where);
    r.pp_bubble = field<std::vector<double>>(record, "rank_pp_bubble", where);
    r.pp_bubble_theory = field<double>(record, "pp_bubble_theory", where);
    r.pp_activation_bytes = field<std::vector<double>>(record, "rank_pp_activation_bytes", where);
  }
  r.allreduce_p50_s = field_or<double>(record, "allreduce_p50_s", 0, where);
  r.flat_allreduce_p50_s = field_or<double>(record, "flat_allreduce_p50_s", 0, where);
  if (record.contains("sweep")) {
    for (const auto& point : record["sweep"]) {
      r.sweep.push_back({field<int64_t>(point, "bytes", where + " (sweep)"), field<double>(point, "p50_s", where + " (sweep)")});
    }
  }
  return r;
}

json to_json(const Run& r) {
  json j{{"record", kRunRecord}, {"impl", r.impl}, {"model", r.model}, {"scale", r.scale}, {"strategy", r.strategy},
         {"device", r.device}, {"precision", r.precision}, {"world", r.world}, {"nodes", r.nodes},
         {"repeat", r.repeat}, {"versions", r.versions}};
  if (!r.backend.empty()) j["backend"] = r.backend;
  if (!r.unsupported.empty()) {
    j["unsupported"] = r.unsupported;
    return j;
  }
  j.update({{"batch_per_device", r.batch_per_device}, {"params", r.params}, {"grad_bytes", r.grad_bytes},
            {"buckets", r.buckets}, {"bucket_bytes", r.bucket_bytes}, {"p50_s", r.p50_s}, {"p95_s", r.p95_s},
            {"forward_p50_s", r.forward_s}, {"backward_p50_s", r.backward_s}, {"optimizer_p50_s", r.optimizer_s},
            {"peak_mem_bytes", r.peak_mem_bytes}, {"mem_kind", r.mem_kind}});
  if (r.steps > 0) j["steps"] = r.steps;
  if (!r.faults_per_step.empty()) j["rank_faults_per_step"] = r.faults_per_step;
  if (!r.host_allocator.empty()) j["host_allocator"] = r.host_allocator;
  if (!r.model_state.empty()) {
    j["model_state_bytes"] = json::array();
    for (const auto& [params, grads, optimizer] : r.model_state) {
      j["model_state_bytes"].push_back({{"params", params}, {"grads", grads}, {"optimizer", optimizer}});
    }
  }
  if (!r.step_transient.empty()) {
    j["step_transient_bytes"] = json::array();
    for (const auto& [peak, units] : r.step_transient) {
      j["step_transient_bytes"].push_back({{"peak", peak}, {"two_largest_units", units}});
    }
  }
  if (r.tp_size > 0) {
    j["tp_size"] = r.tp_size;
    j["tp_comm_p50_s"] = r.tp_comm_s;
    j["tp_comm_bytes"] = r.tp_comm_bytes;
    j["tp_collectives"] = r.tp_collectives;
  }
  if (!r.pp_schedule.empty()) {
    j.update({{"pp_schedule", r.pp_schedule}, {"pp_microbatches", r.pp_microbatches},
              {"pp_stages_per_rank", r.pp_stages_per_rank}, {"rank_pp_bubble", r.pp_bubble},
              {"pp_bubble_theory", r.pp_bubble_theory}, {"rank_pp_activation_bytes", r.pp_activation_bytes}});
  }
  if (r.exposed_gather_s >= 0) {
    j["exposed_gather_p50_s"] = r.exposed_gather_s;
    j["exposed_reduce_scatter_p50_s"] = r.exposed_reduce_scatter_s;
  }
  if (const Strategy* s = find_strategy(r.strategy); s && s->timing == Timing::GradientAllReduce) {
    j["allreduce_p50_s"] = r.allreduce_p50_s;
    j["flat_allreduce_p50_s"] = r.flat_allreduce_p50_s;
  }
  if (!r.sweep.empty()) {
    j["sweep"] = json::array();
    for (const auto& p : r.sweep) j["sweep"].push_back({{"bytes", p.bytes}, {"p50_s", p.seconds}});
  }
  return j;
}

json to_json(const Results& results) {
  const auto& c = results.config;
  json config{{"models", c.models},   {"strategies", c.strategies}, {"nproc", c.worlds},
              {"precision", c.precision}, {"device", c.device},   {"scale", c.scale},
              {"batch_sizes", c.batch_sizes}, {"steps", c.steps}, {"warmup", c.warmup}, {"min_seconds", c.min_seconds},
              {"repeats", c.repeats}, {"threads", c.threads}, {"peers", c.peers},
              {"python", c.python},   {"project", c.project},     {"link_intra", c.link_intra},
              {"link_inter", c.link_inter}, {"backends", c.backends}, {"sweep", c.sweep},
              {"sweep_min_bytes", c.sweep_min_bytes}, {"sweep_max_bytes", c.sweep_max_bytes},
              {"microbatches", c.microbatches}};
  json doc{{"schema", kResultsSchema}, {"tandem_version", results.tandem_version},
           {"created_utc", results.created_utc}, {"command", results.command},
           {"machine", results.machine}, {"config", config}, {"runs", json::array()},
           {"failures", json::array()}, {"peers_note", results.peers_note}};
  for (const auto& r : results.runs) doc["runs"].push_back(to_json(r));
  for (const auto& f : results.failures) {
    auto j = measurement_json(f.measurement);
    j["repeat"] = f.repeat;
    j["reason"] = f.reason;
    doc["failures"].push_back(j);
  }
  return doc;
}

Results results_from_json(const json& doc, const std::string& source) {
  TANDEM_CHECK(doc.is_object(), source, " is not a JSON object");
  const auto schema = field<std::string>(doc, "schema", source);
  TANDEM_CHECK(schema == kResultsSchema, source, " has schema \"", schema, "\"; this tandem reads \"", kResultsSchema,
               "\" (re-run tandem bench, or use the tandem that wrote it)");
  Results results;
  results.tandem_version = field_or<std::string>(doc, "tandem_version", "", source);
  results.created_utc = field_or<std::string>(doc, "created_utc", "", source);
  results.command = field_or<std::string>(doc, "command", "", source);
  results.peers_note = field_or<std::string>(doc, "peers_note", "", source);
  if (doc.contains("machine")) results.machine = doc["machine"];
  const auto config = field<json>(doc, "config", source);
  const std::string where = source + " (config)";
  auto& c = results.config;
  c.models = field<std::vector<std::string>>(config, "models", where);
  c.strategies = field<std::vector<std::string>>(config, "strategies", where);
  c.worlds = field<std::vector<int>>(config, "nproc", where);
  c.precision = field_or<std::string>(config, "precision", c.precision, where);
  c.device = field_or<std::string>(config, "device", c.device, where);
  c.scale = field_or<std::string>(config, "scale", c.scale, where);
  c.batch_sizes = field_or<std::map<std::string, int>>(config, "batch_sizes", c.batch_sizes, where);
  c.steps = field_or<int>(config, "steps", c.steps, where);
  c.warmup = field_or<int>(config, "warmup", c.warmup, where);
  c.min_seconds = field_or<double>(config, "min_seconds", 0.0, where);  // older files: exactly --steps
  c.repeats = field_or<int>(config, "repeats", c.repeats, where);
  c.threads = field_or<int>(config, "threads", c.threads, where);
  c.peers = field_or<std::string>(config, "peers", c.peers, where);
  c.python = field_or<std::string>(config, "python", c.python, where);
  c.project = field_or<std::vector<std::string>>(config, "project", {}, where);
  c.link_intra = field_or<std::string>(config, "link_intra", c.link_intra, where);
  c.link_inter = field_or<std::string>(config, "link_inter", c.link_inter, where);
  c.backends = field_or<std::vector<std::string>>(config, "backends", {"gloo"}, where);  // older files: Gloo only
  c.sweep = field_or<bool>(config, "sweep", false, where);
  c.sweep_min_bytes = field_or<int64_t>(config, "sweep_min_bytes", c.sweep_min_bytes, where);
  c.sweep_max_bytes = field_or<int64_t>(config, "sweep_max_bytes", c.sweep_max_bytes, where);
  c.microbatches = field_or<int>(config, "microbatches", 0, where);
  const auto runs = field<json>(doc, "runs", source);
  TANDEM_CHECK(runs.is_array(), source, ": \"runs\" is not an array");
  for (size_t i = 0; i < runs.size(); ++i) {
    try {
      results.runs.push_back(run_from_record(runs[i]));
    } catch (const Error& e) {
      throw Error(message(source, ": runs[", i, "]: ", e.what()));
    }
  }
  if (doc.contains("failures")) {
    for (const auto& f : doc["failures"]) {
      results.failures.push_back({measurement_from(f, source + " (failures)"), field_or<int>(f, "repeat", 0, source),
                                  field_or<std::string>(f, "reason", "", source)});
    }
  }
  return results;
}

Results load_results(const std::string& dir) {
  const std::string path = dir + "/results.json";
  std::ifstream in(path);
  TANDEM_CHECK(in.good(), "cannot read ", path, ": no results.json there (is ", dir,
               " the --out folder of a tandem bench run?)");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(message(path, " is not valid JSON: ", e.what()));
  }
  return results_from_json(doc, path);
}

json describe_machine() {
  json m;
  m["cpu"] = first_line_of("/proc/cpuinfo", "model name");
  m["cores"] = std::thread::hardware_concurrency();
  const auto mem = first_line_of("/proc/meminfo", "MemTotal");  // "24546080 kB"
  m["memory_gib"] = mem.empty() ? 0.0 : std::stod(mem) / (1024.0 * 1024.0);
  m["gpus"] = launch::visible_gpu_count();
  utsname u{};
  if (::uname(&u) == 0) {
    m["kernel"] = std::string(u.sysname) + " " + u.release;
    m["host"] = u.nodename;
  }
  return m;
}

void write_text_file(const std::string& path, const std::string& text) {
  detail::write_file_durably(path, [&](int fd) { detail::write_all(fd, text.data(), text.size(), "write " + path); },
                             "tandem bench");
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

}  // namespace tandem::bench
