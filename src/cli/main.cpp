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


int main(int argc, char** argv) {
  deloco::reexec_with_tuned_environment(argv);  // OMP_WAIT_POLICY, OPENBLAS_CORETYPE (util/blas.h)
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
