// deloco/error.h — every error class deloco throws for an input or an operation it refuses: deloco::Error, the
// common base, and one class per module, all declared here (the module headers include this file and declare none).
//
// Contract
//  * Every class below derives from deloco::Error, which derives from std::runtime_error: a caller can catch
//    deloco::Error to handle "deloco refused this input or operation" apart from other exceptions (std::bad_alloc,
//    libtorch's c10::Error, ...), or one class by type; `catch (const std::runtime_error&)` still catches them all.
//    what() is a human-readable message naming the key, file, tensor or peer involved where there is one.
//  * Library code (src/ outside src/cli/, and include/deloco/) throws no bare std::runtime_error: the ctest
//    lint.no_bare_runtime_error fails naming the file:line of any throw of a plain std::runtime_error.
//  * Not everything deloco throws is a deloco::Error: a caller's misuse of an API (calls out of order, an argument
//    code should never pass) throws std::logic_error or std::invalid_argument, and libtorch, the standard library
//    and the allocator throw their own. Catch std::exception to catch them all.
//  * Torch-free: this header needs only the standard library.
#pragma once

#include <stdexcept>
#include <string>

namespace deloco {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// config.h (and every module's config section): a user-facing configuration problem; what() is a complete sentence.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// fs.h: a file or folder that cannot be opened, read, written, renamed or removed (names the path).
class IoError : public Error {
 public:
  using Error::Error;
};

// data.h: a data set that cannot be read or does not fit the config (names the file or shard).
class DataError : public Error {
 public:
  using Error::Error;
};

// tokenizer.h: a tokenizer file that cannot be loaded or text it cannot encode.
class TokenizerError : public Error {
 public:
  using Error::Error;
};

// safetensors.h: a .safetensors file that is malformed or lacks / mistypes a tensor (names the file and tensor).
class SafetensorsError : public Error {
 public:
  using Error::Error;
};

// manifest.h, checkpoint.h, adamw.h: a checkpoint (or a learner's optimizer state) that is missing, malformed, or
// written for another model (names the tensor or key).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// model.h: a user's TorchScript module (model.kind = "torchscript") failed while running, after make_language_model
// had accepted it: its forward threw, or (Trainer) returned non-finite logits. The message names model.path and
// never carries C++ stack frames.
class ModelError : public Error {
 public:
  // what(): "model.path=PATH: forward failed[ WHERE]: DETAIL", WHERE e.g. "at step 12" ("" : nothing).
  ModelError(const std::string& path, const std::string& detail, const std::string& where = "");
  // what(): `message` as it is (it names model.path itself); path() and detail() are empty.
  explicit ModelError(const std::string& message);
  const std::string& path() const { return path_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string path_, detail_;
};

// merge.h: a merge (the syncer's outer aggregation of learner deltas) given inputs it cannot combine.
class MergeError : public Error {
 public:
  using Error::Error;
};

// outer.h: the outer optimizer given a state or a delta that does not fit its parameters.
class OuterError : public Error {
 public:
  using Error::Error;
};

// sync.h: the syncer refusing an operation or a state it cannot serve (names the fragment or learner).
class SyncError : public Error {
 public:
  using Error::Error;
};

// wire.h: a frame that is malformed (names the field and the value found); the syncer counts it as malformed_frame.
class WireError : public Error {
 public:
  explicit WireError(const std::string& what) : Error(what) {}
};

// quantize.h: a well-formed float payload whose numbers are not finite: a NaN or ±Inf element (fp32, bf16), a NaN
// or ±Inf block scale (int8, int4, int2), or a finite scale times a value that overflows. The sender's numbers are
// bad, not its framing (the syncer counts it as non_finite, not malformed_frame).
class NonFiniteError : public WireError {
 public:
  using WireError::WireError;
};

// transport.h, runtime.h: a connection that cannot be made or used (names the endpoint), or a learner's comms
// thread that failed.
class TransportError : public Error {
 public:
  using Error::Error;
};

// runtime.h, embed.h (LearnerNode): the syncer refused this learner for good (another model, a wrong key, a
// permanent reject); the message says which syncer (shard) and why. Retrying the same learner will not help.
class RefusedError : public Error {
 public:
  using Error::Error;
};

// group.h, workload.h: a learner group (learner.ranks > 1) that cannot form (names the address) or whose control
// traffic is malformed, or a workload that cannot train as a group.
class GroupError : public Error {
 public:
  using Error::Error;
};

// goodput_fit.h: `deloco goodput --fit` whose optimizer (NLopt) could not be created or failed.
class GoodputError : public Error {
 public:
  using Error::Error;
};

// src/run (`deloco run`'s LocalCluster and supervisor): a child process that cannot be started (fork, socket, free
// port) or that failed too often (a crash loop; the message carries its log tail).
class RunError : public Error {
 public:
  using Error::Error;
};

}  // namespace deloco
