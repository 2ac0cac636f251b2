// `tandem doctor LOGDIR`: what the flight recorders of a failed job say (Note [Flight recorder] in
// src/comm/flight_recorder.h): the same analysis `tandem run` prints when a job fails, read again
// from its log folder (or any folder of flight_rank_*.txt files).
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "launch/flight_analysis.h"
#include "tandem/error.h"

namespace tandem::cli {

Command add_doctor_command(CLI::App& app) {
  auto* sub = app.add_subcommand("doctor", "Explain a failed job from its ranks' flight records");
  auto dir = std::make_shared<std::string>();
  sub->add_option("logdir", *dir, "The job's log folder (tandem run's --log-dir), or a folder of flight_rank_*.txt")
      ->required();
  return [dir]() -> int {
    struct stat st {};
    TANDEM_CHECK(::stat(dir->c_str(), &st) == 0 && S_ISDIR(st.st_mode), "tandem doctor: ", *dir, " is not a folder");
    const auto dumps = launch::read_flight_dumps(*dir);
    TANDEM_CHECK(!dumps.empty(), "tandem doctor: no flight records (flight_rank_*.txt) in ", *dir,
                 " or its last attempt_<n> folder");
    std::printf("tandem doctor: %zu flight record(s) of a world of %d\n", dumps.size(), dumps.front().world);
    for (const auto& line : launch::analyze_flight_dumps(dumps)) std::printf("%s\n", line.c_str());
    return 0;
  };
}

}  // namespace tandem::cli
