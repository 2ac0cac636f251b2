#include "plan/hardware.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "tandem/error.h"

namespace tandem::plan {

// Note [Hardware profiles]
// A profile is one node, repeated `nodes` times. The GPU ones carry the vendor's dense peaks
// (H100 SXM: 989 TFLOP/s bf16, 67 TFLOP/s fp32 without TF32; H200 the same chip with 141 GB;
// A100 SXM: 312 / 19.5) and an efficiency, the share of the peak a training step's matmuls
// reach: 0.5 is what large bf16 GEMMs sustain on Hopper, not a fit to any table this planner is
// checked against. The links are NCCL-tests' bus bandwidths: NVLink 4 (H100/H200) ~370 GB/s and
// A100's NVLink 3 ~230 GB/s inside a node, 400 Gb/s InfiniBand per GPU between nodes. The runtime's
// own memory on a GPU is the CUDA context, cuBLAS's workspace and NCCL's buffers (~1.5 GiB; the
// caching allocator's fragmentation is not modelled).
// Memory bandwidth (H100 SXM 3.35 TB/s, H200 4.8, A100 2.0) prices what is not a matmul: the
// elementwise work over the activations and the optimizer's pass over its state. A GPU's kernel
// launches queue ahead of its work and cost nothing here (op_overhead_us 0); a CPU process pays
// each operator's dispatch (4 us, fitted with the rate below).
// The "cpu" profile is this kind of machine (2 cores, 24 GiB, Gloo over loopback), measured: the
// matmul rate, the bandwidth, the operator overhead and the runtime's own memory are what
// `tandem plan --fit-profile docs/benchmarks/memory-frontier-cpu-2026-12-08-world2` prints (a
// least-squares fit to that run's six DDP probes; every other probe is held out: docs/benchmarks.md,
// "Planning"), the link the all-reduce sweeps' fit (docs/benchmarks/backends-cpu-*). Processes beyond the cores share them: each reaches
// compute_units / devices of a core.

namespace {

Profile gpu(const std::string& name, const std::string& description, double memory_gib, double bf16, double fp32,
            double bandwidth, const std::string& intra) {
  Profile p;
  p.name = name;
  p.description = description;
  p.device = "cuda";
  p.devices_per_node = 8;
  p.memory_bytes = static_cast<int64_t>(memory_gib * kGiB);
  p.runtime_bytes = static_cast<int64_t>(1.5 * kGiB);
  p.bf16_flops = bf16;
  p.fp32_flops = fp32;
  p.efficiency = 0.5;
  p.memory_bandwidth = bandwidth;
  p.intra = bench::parse_link(intra);
  p.inter = bench::parse_link("ib400");
  p.overlap = 1.0;
  return p;
}

std::vector<Profile> builtins() {
  Profile cpu;
  cpu.name = "cpu";
  cpu.description = "this kind of machine: 2 cores, 24 GiB, one process per core, Gloo over loopback (measured)";
  cpu.device = "cpu";
  cpu.devices_per_node = 2;
  cpu.compute_units = 2;
  cpu.memory_bytes = static_cast<int64_t>(11 * kGiB);
  cpu.runtime_bytes = static_cast<int64_t>(0.1932 * kGiB);
  cpu.fp32_flops = 221.9e9;
  cpu.memory_bandwidth = 1.907e9;
  cpu.bf16_flops = 0;
  cpu.efficiency = 1.0;
  cpu.intra = bench::parse_link("250:1.2");
  cpu.inter = bench::parse_link("eth10");
  cpu.overlap = 0.5;
  cpu.op_overhead_s = 4e-6;
  return {gpu("h100-8x", "8 x H100 SXM 80 GB per node, NVLink 4, 400 Gb/s InfiniBand per GPU", 79.1, 989e12, 67e12,
              3.35e12, "nvlink"),
          gpu("h200-8x", "8 x H200 SXM 141 GB per node, NVLink 4, 400 Gb/s InfiniBand per GPU", 139.8, 989e12, 67e12,
              4.8e12, "nvlink"),
          gpu("a100-8x", "8 x A100 SXM 80 GB per node, NVLink 3, 400 Gb/s InfiniBand per GPU", 79.1, 312e12, 19.5e12,
              2.0e12, "2:230"),
          cpu};
}

bench::Link link_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) return bench::parse_link(j.get<std::string>());
  TANDEM_CHECK(j.is_object() && j.contains("alpha_us") && j.contains("busbw_gbps") && j.at("alpha_us").is_number() &&
                   j.at("busbw_gbps").is_number(),
               where, ": a link is a name (nvlink, ib100, ib400, eth10, eth100), \"ALPHA_US:BUSBW_GBPS\" or "
               "{\"alpha_us\": .., \"busbw_gbps\": ..}");
  bench::Link link;
  link.name = "file";
  link.alpha_s = j.at("alpha_us").get<double>() * 1e-6;
  link.busbw_Bps = j.at("busbw_gbps").get<double>() * 1e9;
  TANDEM_CHECK(link.alpha_s >= 0 && link.busbw_Bps > 0 && std::isfinite(link.alpha_s) && std::isfinite(link.busbw_Bps),
               where, ": alpha_us must not be negative and busbw_gbps must be positive");
  return link;
}

}  // namespace

void check_devices(const Profile& p, const std::string& where) {
  TANDEM_CHECK(p.devices_per_node > 0 && p.nodes > 0 && p.devices_per_node <= 4096 && p.nodes <= 65536 &&
                   static_cast<int64_t>(p.devices_per_node) * p.nodes <= (int64_t{1} << 20),
               where, ": ", p.nodes, " node(s) x ", p.devices_per_node,
               " device(s): each must be positive, and at most 2^20 devices in all");
}

double Profile::achieved_flops(const std::string& precision) const {
  const double peak = precision == "fp32" ? fp32_flops : bf16_flops;
  TANDEM_CHECK(peak > 0, "profile ", name, " has no ", precision, " rate (its flops.", precision, " is 0)");
  return peak * efficiency * share();
}

double Profile::share() const {
  return compute_units > 0 && devices_per_node > compute_units ? static_cast<double>(compute_units) / devices_per_node
                                                                : 1.0;
}

std::vector<std::string> profile_names() {
  std::vector<std::string> names;
  for (const auto& p : builtins()) names.push_back(p.name);
  return names;
}

nlohmann::json profile_json(const Profile& p) {
  auto link = [](const bench::Link& l) {
    return nlohmann::json{{"alpha_us", l.alpha_s * 1e6}, {"busbw_gbps", l.busbw_Bps / 1e9}};
  };
  return {{"name", p.name},
          {"description", p.description},
          {"device", p.device},
          {"devices_per_node", p.devices_per_node},
          {"nodes", p.nodes},
          {"compute_units", p.compute_units},
          {"memory_gib", static_cast<double>(p.memory_bytes) / kGiB},
          {"runtime_gib", static_cast<double>(p.runtime_bytes) / kGiB},
          {"flops", {{"fp32", p.fp32_flops}, {"bf16", p.bf16_flops}}},
          {"efficiency", p.efficiency},
          {"memory_bandwidth_gbps", p.memory_bandwidth / 1e9},
          {"intra", link(p.intra)},
          {"inter", link(p.inter)},
          {"overlap", p.overlap},
          {"op_overhead_us", p.op_overhead_s * 1e6}};
}

Profile profile_from_json(const nlohmann::json& j, const std::string& where) {
  TANDEM_CHECK(j.is_object(), where, ": a profile is a JSON object (see tandem plan --show-profile h100-8x)");
  static const std::vector<std::string> known{"name", "description", "device", "devices_per_node", "nodes",
                                              "compute_units", "memory_gib", "runtime_gib", "flops", "efficiency",
                                              "memory_bandwidth_gbps", "op_overhead_us",
                                              "intra", "inter", "overlap"};
  for (const auto& item : j.items()) {
    TANDEM_CHECK(std::find(known.begin(), known.end(), item.key()) != known.end(), where, ": unknown field '",
                 item.key(), "'");
  }
  for (const char* count : {"devices_per_node", "nodes", "compute_units"}) {
    TANDEM_CHECK(!j.contains(count) || j.at(count).is_number_integer(), where, ": ", count, " must be a whole number");
  }
  Profile p;
  try {
    p.name = j.value("name", where);
    p.description = j.value("description", std::string());
    p.device = j.value("device", std::string("cuda"));
    p.devices_per_node = j.at("devices_per_node").get<int>();
    p.nodes = j.value("nodes", 1);
    p.compute_units = j.value("compute_units", 0);
    p.memory_bytes = static_cast<int64_t>(j.at("memory_gib").get<double>() * kGiB);
    p.runtime_bytes = static_cast<int64_t>(j.value("runtime_gib", 0.0) * kGiB);
    p.fp32_flops = j.at("flops").value("fp32", 0.0);
    p.bf16_flops = j.at("flops").value("bf16", 0.0);
    p.efficiency = j.value("efficiency", 1.0);
    p.memory_bandwidth = j.at("memory_bandwidth_gbps").get<double>() * 1e9;
    p.intra = link_from_json(j.at("intra"), where + ": intra");
    p.inter = link_from_json(j.value("inter", nlohmann::json("ib400")), where + ": inter");
    p.overlap = j.value("overlap", 1.0);
    p.op_overhead_s = j.value("op_overhead_us", 0.0) * 1e-6;
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": " + e.what());
  }
  TANDEM_CHECK(p.device == "cuda" || p.device == "cpu", where, ": device is cuda or cpu (got ", p.device, ")");
  check_devices(p, where);
  TANDEM_CHECK(p.compute_units >= 0, where, ": compute_units must not be negative");
  TANDEM_CHECK(p.memory_bytes > 0 && p.runtime_bytes >= 0 && p.runtime_bytes < p.memory_bytes, where,
               ": memory_gib must be positive and above runtime_gib");
  TANDEM_CHECK(p.fp32_flops > 0 || p.bf16_flops > 0, where, ": flops.fp32 or flops.bf16 must be positive");
  TANDEM_CHECK(p.efficiency > 0 && p.efficiency <= 1 && p.overlap >= 0 && p.overlap <= 1, where,
               ": efficiency must be in (0, 1] and overlap in [0, 1]");
  TANDEM_CHECK(p.op_overhead_s >= 0, where, ": op_overhead_us must not be negative");
  TANDEM_CHECK(p.memory_bandwidth > 0, where, ": memory_bandwidth_gbps must be positive");
  return p;
}

Profile load_profile(const std::string& name_or_path) {
  const bool is_file = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json");
  if (!is_file) {
    for (const auto& p : builtins()) {
      if (p.name == name_or_path) return p;
    }
    std::string known;
    for (const auto& n : profile_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown profile '" + name_or_path + "' (built in: " + known + "; or a JSON file)");
  }
  std::ifstream in(name_or_path);
  TANDEM_CHECK(in.good(), "profile file ", name_or_path, ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error("profile file " + name_or_path + ": not JSON (" + std::string(e.what()) + ")");
  }
  return profile_from_json(j, "profile file " + name_or_path);
}

}  // namespace tandem::plan
