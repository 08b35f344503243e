// deloco — resilient, low-communication distributed training. This file only wires subcommands together.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "common.h"
#include "util/blas.h"
#include "util/malloc_tuning.h"

namespace {

// Two libraries read their settings from the environment in constructors that run before main(), so the only way
// to change them is to set the variable and execute ourselves again, once:
// - libgomp's OMP_WAIT_POLICY: spinning OpenMP workers halve the speed of two training threads on a two-core
//   machine, so deloco asks for the passive policy when the user set none;
// - OpenBLAS's OPENBLAS_CORETYPE: on a CPU model newer than the library, OpenBLAS falls back to generic SSE3
//   kernels (util/blas.h), so deloco names the kernels the CPU runs when the user named none.
// If exec fails we simply continue as we are.
void prepare_environment(char** argv) {
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    changed = true;
  }
  const char* keep = std::getenv("DELOCO_KEEP_BLAS_CORE");
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && (keep == nullptr || std::strcmp(keep, "1") != 0)) {
    const std::string chosen = deloco::openblas_core_name();
    const std::string better = deloco::better_openblas_core(chosen, deloco::host_cpu_features());
    if (!better.empty()) {
      ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
      ::setenv(deloco::kBlasFallbackEnv, chosen.c_str(), 1);  // so logs can say what was corrected
      changed = true;
    }
  }
  if (changed) ::execv("/proc/self/exe", argv);
}

}  // namespace

int main(int argc, char** argv) {
  prepare_environment(argv);
  deloco::tune_malloc_for_training();  // before anything large is allocated (util/malloc_tuning.h)
  deloco::cli::set_program(argv[0]);
  CLI::App app{"deloco: resilient, low-communication distributed training (DiLoCo, Decoupled DiLoCo, IsoLoCo)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deloco 0.1.0");
  deloco::cli::add_train_commands(app);
  deloco::cli::add_goodput_command(app);
  deloco::cli::add_report_command(app);
  deloco::cli::add_merge_command(app);
  deloco::cli::add_sim_command(app);
  deloco::cli::add_keygen_command(app);
  deloco::cli::add_node_commands(app);
  deloco::cli::add_tokenize_command(app);
  deloco::cli::add_run_command(app);
  deloco::cli::add_config_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "deloco: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
