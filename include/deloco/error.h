// deloco/error.h — deloco::Error, the common base of the module errors deloco throws for an input or an
// operation it refuses.
//
// Contract: each module's error class (ConfigError, DataError, TokenizerError, IoError, SafetensorsError,
// CheckpointError, ModelError, MergeError, OuterError, SyncError, WireError and its NonFiniteError, TransportError)
// derives from deloco::Error, which derives from std::runtime_error. A caller can catch deloco::Error to handle
// "deloco refused this input or operation" apart from other exceptions (std::bad_alloc, libtorch's c10::Error,
// ...); what() is a human-readable message naming the key, file or peer involved where there is one.
// Not everything deloco throws is a deloco::Error: a caller's misuse of an API (calls out of order, an argument
// code should never pass) throws std::logic_error or std::invalid_argument, and some failures of the drivers and
// the CLI are a plain std::runtime_error (a learner group's rank, an optimizer state that lacks a tensor, a process
// that could not be started, a run of `deloco run` that failed). Catch std::exception to catch them all.
#pragma once

#include <stdexcept>
#include <string>

namespace deloco {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace deloco
