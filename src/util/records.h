// util/records.h — the JSON-lines record files every node writes (syncer.jsonl, learner-N.jsonl).
//
// Contract
//  * JsonlWriter appends to its file (a restarted process continues the same file), one flushed line per record:
//    a crash loses at most the line being written.
//  * Records quote peers (reject details, key names): bytes that are not valid UTF-8 are written as U+FFFD instead
//    of making the dump throw, so no peer text can make a record fail.
//  * Thread-safe: several threads may write to one writer.
//  * Throws IoError naming the path when the file cannot be opened.
#pragma once

#include <fstream>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace deloco {

class JsonlWriter {
 public:
  explicit JsonlWriter(const std::string& path);
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::mutex mu_;
  std::ofstream out_;
};

}  // namespace deloco
