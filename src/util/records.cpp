#include "util/records.h"

#include "util/fs.h"

namespace deloco {

JsonlWriter::JsonlWriter(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw IoError("cannot open '" + path + "' for appending");
}

void JsonlWriter::write(const nlohmann::json& record) {
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard<std::mutex> lock(mu_);
  out_ << line << "\n";
  out_.flush();
}

}  // namespace deloco
