// deloco — resilient, low-communication distributed training. This file only wires subcommands together.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "common.h"

namespace {

// libgomp reads OMP_WAIT_POLICY in a constructor that runs before main(); spinning OpenMP workers halve the
// speed of two training threads on a two-core machine. If the user set nothing, re-execute ourselves once with
// the passive policy so every OpenMP pool starts with it.
void ensure_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::execv("/proc/self/exe", argv);
  // If exec fails we simply continue with the default policy.
}

}  // namespace

int main(int argc, char** argv) {
  ensure_passive_openmp(argv);
  deloco::cli::set_program(argv[0]);
  CLI::App app{"deloco: resilient, low-communication distributed training (DiLoCo, Decoupled DiLoCo, IsoLoCo)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deloco 0.1.0");
  deloco::cli::add_train_commands(app);
  deloco::cli::add_goodput_command(app);
  deloco::cli::add_merge_command(app);
  deloco::cli::add_sim_command(app);
  deloco::cli::add_keygen_command(app);
  deloco::cli::add_node_commands(app);
  deloco::cli::add_tokenize_command(app);
  deloco::cli::add_run_command(app);
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
