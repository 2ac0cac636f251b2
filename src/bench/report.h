#pragma once
// Writing a bench folder: results.json (measurements + derived sections), results.md and the
// plots, all from one Results. `tandem bench` calls it at the end (and after every measurement
// for results.json, so an interrupted run keeps what it measured); `tandem report DIR` calls it
// on a results.json read back.
#include <string>

#include "bench/analysis.h"

namespace tandem::bench {

/// results.json with only the measured part (cheap; after every measurement).
void save_measurements(const std::string& dir, const Results& results);

struct Written {
  Analysis analysis;
  std::string markdown;
  std::vector<std::string> files;  // what was written, for the summary line
  std::string plot_note;           // why a plot is missing, when one is
};

/// results.json (measured + derived), results.md, throughput.png, memory.png, breakdown.png.
Written write_report(const std::string& dir, const Results& results);

}  // namespace tandem::bench
