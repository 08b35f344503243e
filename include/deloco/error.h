// deloco/error.h — the common base of every error deloco throws on purpose.
//
// Contract: each module's error class (ConfigError, DataError, IoError, SafetensorsError, CheckpointError,
// MergeError, OuterError, SyncError, WireError, TransportError) derives from deloco::Error, which derives from
// std::runtime_error. A caller can catch deloco::Error to handle "deloco refused this input or operation" apart from
// other exceptions (std::bad_alloc, libtorch's c10::Error, ...); what() is always a complete, human-readable message
// naming the key, file or peer involved.
#pragma once

#include <stdexcept>
#include <string>

namespace deloco {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace deloco
