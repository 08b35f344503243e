// src/cli/commands.h — every `deloco` subcommand registers itself here. The CLI is a thin layer: parse the
// command line and config, call the library, print results. Each add_* function adds one or more subcommands
// to `app`; their callbacks throw on error (main prints the message and exits 1).
#pragma once

#include <CLI/CLI.hpp>

namespace deloco::cli {

void add_train_commands(CLI::App& app);    // train, eval, sample   (cmd_train.cpp)
void add_goodput_command(CLI::App& app);   // goodput               (cmd_goodput.cpp)
void add_merge_command(CLI::App& app);     // merge                 (cmd_merge.cpp)
void add_sim_command(CLI::App& app);       // sim                   (cmd_sim.cpp)
void add_keygen_command(CLI::App& app);    // keygen                (cmd_keygen.cpp)
void add_node_commands(CLI::App& app);     // syncer, learner       (cmd_node.cpp)
void add_run_command(CLI::App& app);       // run                   (cmd_run.cpp)
void add_tokenize_command(CLI::App& app);  // tokenize              (cmd_tokenize.cpp)
void add_report_command(CLI::App& app);    // report                (cmd_report.cpp)
void add_config_command(CLI::App& app);    // config keys, presets  (cmd_config.cpp)

}  // namespace deloco::cli
