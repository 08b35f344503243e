// util/fs.h — small file helpers with crash-safe writes, and the file-operation layer they go through.
//
// Contract
//  * FileOps is the set of mutating file-system operations a crash-safe writer needs (make directories, create
//    and write a file, fsync a file or a directory, rename, remove). Writers that must survive a crash at any
//    moment (write_file_atomic, the checkpoint writer of util/checkpoint_store.h) take a FileOps so a test can
//    substitute one that "crashes" after the k-th operation (tests/support/fault_file_ops.h) and check what a
//    restart finds. real_file_ops() is the POSIX implementation: every operation throws IoError naming the path
//    on failure; sync_dir is best effort (some file systems refuse to fsync a directory). Reads are not routed
//    through FileOps: they change nothing a crash could tear.
//  * write_file_atomic writes "<path>.tmp.<pid>", fsyncs it, renames it over `path` and fsyncs the directory, so
//    a reader sees either the old file or the complete new one, never a torn file. On an error (IoError) it
//    removes the temporary file; after a crash one may remain, which recovery of the folder's owner removes
//    (e.g. recover_run_folder of util/checkpoint_store.h for "latest").
//  * is_stale_temp_name(name, stem) says whether a directory entry is a temporary of this layer's naming
//    ("<stem>.tmp.<pid>", or any ".<name>.tmp.<pid>" when stem is empty) left by a process that is gone (or by
//    this process): those are garbage a recovery pass may delete. A temporary of another live process is not.
//  * All functions throw IoError naming the path on failure.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "deloco/error.h"
#include "util/hash.h"

namespace deloco {

class FileOps {
 public:
  virtual ~FileOps() = default;
  // mkdir -p: creates `path` and its missing parents, each made durable in its parent (fsync); nothing when it exists.
  virtual void make_dirs(const std::string& path) = 0;
  // Creates or truncates `path` and writes `bytes` to it (not yet durable: see sync_file).
  virtual void write_file(const std::string& path, const std::string& bytes) = 0;
  // Makes a file's data durable (fsync).
  virtual void sync_file(const std::string& path) = 0;
  // Makes a directory's entries (creations, renames, removals inside it) durable (fsync of the directory).
  virtual void sync_dir(const std::string& dir) = 0;
  // rename(2): atomic; replaces an existing file `to`, or moves a directory to a `to` that does not exist.
  virtual void rename(const std::string& from, const std::string& to) = 0;
  // rm -rf; nothing when `path` does not exist.
  virtual void remove_all(const std::string& path) = 0;
};

// The POSIX implementation (stateless, thread-safe).
FileOps& real_file_ops();

std::string read_file(const std::string& path);
void write_file_atomic(const std::string& path, const std::string& bytes, FileOps& ops = real_file_ops());
// fsync of a folder (its entries durable): IoError when it cannot be opened or the flush fails, except on a
// filesystem without directory fsync (EINVAL, ENOTSUP), where it does nothing.
void fsync_dir(const std::string& dir);
// The temporary name write_file_atomic uses for `path`: "<path>.tmp.<pid>".
std::string temp_name_for(const std::string& path);
bool is_stale_temp_name(const std::string& name, const std::string& stem);

}  // namespace deloco
