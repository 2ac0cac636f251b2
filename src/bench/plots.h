#pragma once
// The report's PNG plots, drawn by gnuplot from the comparison table (Note [Plots] in plots.cpp):
// throughput against world size, peak memory per device, and the step-time breakdown.
#include <string>
#include <utility>
#include <vector>

#include "bench/analysis.h"
#include "bench/results.h"

namespace tandem::bench {

/// What draw_plots produced: the PNGs drawn (names relative to the report directory, e.g.
/// "throughput.png"), and why nothing or only some were drawn ("" when all three were).
struct PlotOutcome {
  std::vector<std::string> files;
  std::string note;  // why nothing/some was drawn
};

/// Writes throughput.png, memory.png and breakdown.png (and their .dat/.gp inputs under DIR/plots/)
/// into `dir` with gnuplot (`gnuplot` on PATH, or $TANDEM_GNUPLOT). Missing gnuplot: no files, a note.
/// A gnuplot failure: a note with its first stderr line; never throws for plotting problems.
PlotOutcome draw_plots(const std::string& dir, const Results& results, const Analysis& analysis);

/// One plot for draw_gnuplot_plots: NAME.png drawn by plots/NAME.gp from plots/NAME.dat.
struct GnuplotPlot {
  std::string name;     // "throughput": throughput.png, plots/throughput.{gp,dat}
  std::string script, data;
  std::string skipped;  // non-empty: nothing to draw, and why
};
/// Writes each plot's inputs under DIR/plots/ and runs gnuplot on them (what draw_plots does for
/// the comparison's plots; the memory frontier draws its own through it). Never throws.
PlotOutcome draw_gnuplot_plots(const std::string& dir, const std::vector<GnuplotPlot>& plots);
/// `path` as a gnuplot single-quoted string (any path survives).
std::string gnuplot_path_literal(const std::string& path);

/// The gnuplot scripts and data files, without running anything (what draw_plots feeds gnuplot) — testable.
/// A plot with nothing to draw (e.g. no memory measured) has no files here.
struct PlotInputs {
  std::vector<std::pair<std::string, std::string>> files;  // (relative path, content)
};
PlotInputs plot_inputs(const std::string& dir, const Results& results, const Analysis& analysis);

}  // namespace tandem::bench
