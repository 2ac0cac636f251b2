// `tandem`: run | env | checkpoint | bench | report | doctor | plan (Note [Two binaries] in commands.h).
#include "cli/commands.h"
#include "tandem/version.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem: data-parallel training for LibTorch C++ programs", "tandem"};
  app.set_version_flag("--version", std::string("tandem ") + tandem::version());
  return tandem::cli::run_cli(app, argc, argv, [&](CLI::App& a, const std::vector<std::string>& after_separator) {
    return std::vector<tandem::cli::Command>{
        tandem::cli::add_run_command(a, after_separator),
        tandem::cli::add_helper_command(a, "env", "Print versions, devices, threads and the distributed environment"),
        tandem::cli::add_helper_command(a, "checkpoint",
                                        "Inspect an Accelerator checkpoint, or consolidate its optimizer state"),
        tandem::cli::add_bench_command(a, argc, argv),
        tandem::cli::add_report_command(a),
        tandem::cli::add_doctor_command(a),
        tandem::cli::add_plan_command(a),
    };
  });
}
