// `deloco keygen --out STEM`: writes a CURVE key pair as STEM.key (mode 0600, public and secret) and STEM.pub
// (public only), for the syncer's net.secret_key / the learners' net.server_key and the allow-list directory
// (net.allow). Never overwrites: an existing file is an error (exit 1 through main's error path).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "deloco/transport.h"

namespace deloco::cli {
namespace {

void run_keygen(const std::string& stem) {
  const std::filesystem::path parent = std::filesystem::path(stem).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const KeyPair kp = generate_keypair();
  write_keypair(stem, kp);
  std::cout << "public key: " << kp.public_key << "\n"
            << "secret:     " << stem << ".key (mode 0600; keep it on this machine)\n"
            << "public:     " << stem << ".pub (copy it to the syncer's allow-list directory, or to learners as "
            << "net.server_key)\n";
}

}  // namespace

void add_keygen_command(CLI::App& app) {
  auto stem = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "keygen", "write a CURVE key pair for the transport: STEM.key (secret, 0600) and STEM.pub (see docs/transport.md)");
  sub->add_option("--out", *stem, "path stem of the two files, e.g. keys/learner-0")->required();
  sub->callback([stem]() { run_keygen(*stem); });
}

}  // namespace deloco::cli
