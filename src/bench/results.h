#pragma once
// results.json: what one `tandem bench` run measured, as the workers reported it, plus the
// configuration and the machine. Everything else in the report is derived from this file, so
// `tandem report DIR` can re-render it and `tandem report A B` compare two (docs/benchmarks.md,
// "results.json").
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/plan.h"
#include "bench/projection.h"

namespace tandem::bench {

/// The schema this build writes and reads; a file with another version is refused by name.
constexpr const char* kResultsSchema = "tandem-bench/1";
/// The record a worker writes (bench/worker.cpp, bench/peer.py).
constexpr const char* kRunRecord = "tandem-bench-run/1";

/// One measurement's record (one worker process group, one repeat).
struct Run {
  std::string impl, model, scale, strategy, device, precision;
  std::string backend;            // multi-process: "gloo" | "mpi" (absent in old records: gloo); else ""
  int world = 1;
  int nodes = 1;
  int repeat = 0;                 // -1: outside the repeats (the link sweep)
  int64_t batch_per_device = 0, params = 0, grad_bytes = 0;
  int steps = 0;                  // timed steps run (--min-seconds may run more than asked); 0: not recorded
  int buckets = 0;
  std::vector<int64_t> bucket_bytes;
  double p50_s = 0, p95_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;
  std::vector<double> peak_mem_bytes;  // per device: rank RSS, replica total, or CUDA peak
  std::string mem_kind;
  std::vector<double> faults_per_step;  // per rank: minor page faults per timed step (absent in older files)
  std::string host_allocator;     // "keep-freed", "system", "tunables" (absent in older files)
  /// Per rank, accounted model state: parameter, gradient and optimizer-state bytes (strategies
  /// with `model_state` in the table; absent otherwise and in older files).
  std::vector<std::array<int64_t, 3>> model_state;
  /// Per rank, under fsdp: the most a step held at once beyond that state (gathered parameters,
  /// whole gradients), and its two largest units' bytes (absent otherwise).
  std::vector<std::array<int64_t, 2>> step_transient;
  /// Under fsdp, rank 0: host time blocked per step on all-gathers and on reduce-scatters, p50
  /// (Note [Exposed communication] in src/fsdp/engine.cpp); < 0: not recorded.
  double exposed_gather_s = -1, exposed_reduce_scatter_s = -1;
  /// Under tensor parallelism, rank 0's TP group per timed step: the host time blocked in its
  /// collectives (p50), their buffers' bytes and their count (Note [TP traffic] in
  /// bench/worker.cpp); tp_size 0 and the others < 0: not recorded.
  int tp_size = 0;
  double tp_comm_s = -1;
  int64_t tp_comm_bytes = -1, tp_collectives = -1;
  /// Under pipeline parallelism (one pipeline over every rank: Note [Pipeline measurements] in
  /// bench/worker.cpp): its schedule ("" none), microbatches per step and stages per rank; the
  /// share of the step a rank was blocked on its neighbours, p50 over the timed steps (the bubble
  /// as it saw it), by rank, beside (P - 1) / (v m + P - 1); the most activation bytes a rank
  /// held at once in a step, by rank (< 0: not measured, as PyTorch's on CPU).
  std::string pp_schedule;
  int pp_microbatches = 0, pp_stages_per_rank = 0;
  std::vector<double> pp_bubble;
  double pp_bubble_theory = -1;
  std::vector<double> pp_activation_bytes;
  double allreduce_p50_s = 0, flat_allreduce_p50_s = 0;
  std::vector<SweepPoint> sweep;
  std::string unsupported;        // set: this combination does not exist; no timings
  nlohmann::json versions = nlohmann::json::object();

  Measurement measurement() const { return {impl, model, strategy, world, backend}; }
};

/// Parses a worker's record; throws tandem::Error naming the missing or mistyped field.
Run run_from_record(const nlohmann::json& record);
nlohmann::json to_json(const Run& run);

/// A measurement that produced no record, and why (its log is named in `reason`).
struct Failure {
  Measurement measurement;
  int repeat = 0;
  std::string reason;
};

struct Results {
  std::string tandem_version, created_utc, command;
  nlohmann::json machine = nlohmann::json::object();
  BenchConfig config;
  std::vector<Run> runs;
  std::vector<Failure> failures;
  std::string peers_note;         // why the PyTorch peers are absent, when they are
};

/// The measured part (schema, machine, config, runs, failures); derived sections are added by
/// the caller (analysis.h).
nlohmann::json to_json(const Results& results);
/// Reads results.json's measured part back; throws tandem::Error naming the file and the field.
Results results_from_json(const nlohmann::json& doc, const std::string& source);
Results load_results(const std::string& dir);

/// This machine, for the report: CPU model, cores, memory, GPUs, kernel, host.
nlohmann::json describe_machine();

/// What `path` holds ("" when it cannot be read).
std::string read_text_file(const std::string& path);

/// Now, as the records' "created_utc" (2026-12-05T20:31:13Z).
std::string utc_now();

/// Writes `text` to `path` durably (Note [Durable writes]): a reader never sees half a file.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace tandem::bench
