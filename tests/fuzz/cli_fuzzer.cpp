// libFuzzer harness for `tandem run`'s option parsing: the input is a command line, split at
// ASCII whitespace into argv words (argv[0] is "tandem"). It goes through run_cli, as `tandem`'s
// main() does, with the `run` subcommand's own flags (add_run_flags) and the host-independent
// checks of launch::resolve_flags; nothing is started, no PATH lookup or port probe is made.
// run_cli answers 0 (parsed) or 2 (a bad flag: CLI11's parse error or tandem::Error); its 1
// ("unexpected error": some other std::exception), an exception escaping it, a sanitizer report or
// accepted options that break resolve_flags' promises are findings (--backend mpi picks its port
// later and takes --nnodes from --hosts).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "launch/launch_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words{"tandem"};
  std::string word;
  for (size_t i = 0; i <= size; ++i) {
    const char c = i < size ? static_cast<char>(data[i]) : ' ';
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());  // a word with a NUL byte ends there, as in a real argv
  argv.push_back(nullptr);

  CLI::App app{"Tandem: data-parallel training for LibTorch C++ programs", "tandem"};
  const int code = tandem::cli::run_cli(
      app, static_cast<int>(words.size()), argv.data(),
      [](CLI::App& a, const std::vector<std::string>& after_separator) {
        auto parsed = tandem::cli::add_run_flags(a, after_separator);
        return std::vector<tandem::cli::Command>{[parsed] {
          tandem::launch::LaunchOptions o = parsed();
          tandem::launch::resolve_flags(o, /*gpu_count=*/2, /*cpu_count=*/4);
          const bool ok = o.nproc >= 1 && o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes &&
                          o.max_restarts >= 0 && o.grace_period.count() >= 0 && o.master_port >= 0 &&
                          o.master_port <= 65535 && !o.master_addr.empty() &&
                          (o.nnodes == 1 || o.master_port != 0 || o.backend == "mpi") &&
                          (o.backend == "auto" || o.backend == "gloo" || o.backend == "mpi") &&
                          (o.hosts.empty() || o.backend == "mpi") &&
                          (o.backend != "mpi" || o.nnodes == 1 ||
                           static_cast<int>(o.host_list.size()) == o.nnodes) &&
                          (!o.elastic || (o.rdzv.min_nodes >= 1 && o.rdzv.min_nodes <= o.rdzv.max_nodes &&
                                          o.nnodes == o.rdzv.max_nodes && o.backend != "mpi" &&
                                          (o.nnodes == 1 || o.master_port != 0)));
          if (!ok) std::abort();
          return 0;
        }};
      });
  if (code != 0 && code != 2) std::abort();
  return 0;
}
