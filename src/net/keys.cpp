// CURVE key pairs, key files and the server's allow-list (see deloco/transport.h).
//
// Key files are small text files so that people can read, copy and diff them:
//   public-key = "<40 Z85 characters>"
//   secret-key = "<40 Z85 characters>"      (only in the 0600 .key file)
// A file holding a secret key is refused unless only its owner may access it (mode & 077 == 0), as ssh does.
// Every error names the file and says what is wrong with it, because these files are written and moved by hand.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "deloco/transport.h"
#include "util/text.h"

namespace deloco {
namespace {

namespace fs = std::filesystem;

constexpr size_t kZ85KeyChars = 40;  // a 32-byte CURVE key in Z85

bool is_z85_key(const std::string& s) {
  static const std::string alphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (s.size() != kZ85KeyChars) return false;
  if (!std::all_of(s.begin(), s.end(), [](char c) { return alphabet.find(c) != std::string::npos; })) return false;
  uint8_t binary[32];
  return zmq_z85_decode(binary, s.c_str()) != nullptr;  // also rejects values that overflow 32 bits per group
}

std::string describe_key(const std::string& s) {
  return "\"" + (s.size() > 60 ? s.substr(0, 60) + "..." : s) + "\" (" + std::to_string(s.size()) + " characters)";
}

struct FileText {
  std::string text;
  mode_t mode = 0;  // permission bits of the file that was read (fstat of the open descriptor: no race)
};

FileText read_text_file(const std::string& path, const char* what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw TransportError(std::string(what) + " " + path + ": no such file");
  if (fs::is_directory(path, ec)) throw TransportError(std::string(what) + " " + path + ": is a directory, not a file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TransportError(std::string(what) + " " + path + ": cannot open: " + std::strerror(errno));
  FileText f;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0;
  f.mode = st.st_mode & 07777;
  char buf[4096];
  while (ok) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    if (f.text.size() > 1 << 20) {  // key files and allow-lists are a few kilobytes
      ::close(fd);
      throw TransportError(std::string(what) + " " + path + ": larger than 1 MiB; is this the right file?");
    }
    f.text.append(buf, static_cast<size_t>(n));
  }
  const int err = errno;
  ::close(fd);
  if (!ok) throw TransportError(std::string(what) + " " + path + ": cannot read: " + std::strerror(err));
  return f;
}

std::string octal_mode(mode_t m) {
  char out[8];
  std::snprintf(out, sizeof out, "%04o", static_cast<unsigned>(m & 07777));
  return out;
}

// Like ssh: a secret key that group or others may read or write is compromised or about to be; refuse to use it.
void check_secret_mode(const std::string& path, mode_t mode) {
  if ((mode & 077) == 0) return;
  throw TransportError("key file " + path + " holds a secret key but has mode " + octal_mode(mode) +
                       ", which lets group or others access it; refusing to use it. Restrict it with: chmod 600 " +
                       path);
}

// Parses `name = "value"` lines (blank lines and lines starting with '#' are skipped) into the two known keys.
// Unknown names are an error: a typo should not silently produce a file that "has no secret key".
struct KeyFileFields {
  std::string public_key, secret_key;
};

KeyFileFields parse_key_file(const std::string& path, const std::string& text) {
  KeyFileFields f;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    const std::string t = trim_space(line);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = "key file " + path + " line " + std::to_string(n) + ": ";
    const size_t eq = t.find('=');
    if (eq == std::string::npos)
      throw TransportError(where + "bad format, expected public-key = \"<z85>\" or secret-key = \"<z85>\"");
    const std::string name = trim_space(t.substr(0, eq));
    std::string value = trim_space(t.substr(eq + 1));
    if (value.size() < 2 || value.front() != '"' || value.back() != '"')
      throw TransportError(where + "bad format, the value of " + name + " must be in double quotes");
    value = value.substr(1, value.size() - 2);
    std::string* slot = name == "public-key" ? &f.public_key : name == "secret-key" ? &f.secret_key : nullptr;
    if (slot == nullptr)
      throw TransportError(where + "unknown entry '" + name + "' (expected public-key or secret-key)");
    if (!slot->empty()) throw TransportError(where + name + " given twice");
    if (!is_z85_key(value))
      throw TransportError(where + name + " is not a CURVE key of 40 Z85 characters: " + describe_key(value));
    *slot = value;
  }
  return f;
}

// Creates `path` exclusively (never overwriting) with `mode` and writes `text`; throws naming the file.
void write_new_file(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) throw TransportError("key file " + path + " already exists; refusing to overwrite it");
    throw TransportError("cannot create key file " + path + ": " + std::strerror(errno));
  }
  // The umask may only remove bits, but be explicit: the secret file must never be readable by others.
  bool ok = ::fchmod(fd, mode) == 0;
  size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    ::unlink(path.c_str());
    throw TransportError("cannot write key file " + path + ": " + std::strerror(err));
  }
}

// Reads and parses a key file; one that holds a secret key must have a private mode (whichever reader reads it).
KeyFileFields read_key_file(const std::string& path) {
  const FileText t = read_text_file(path, "key file");
  KeyFileFields f = parse_key_file(path, t.text);
  if (!f.secret_key.empty()) check_secret_mode(path, t.mode);
  return f;
}

}  // namespace

KeyPair generate_keypair() {
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (!zmq_has("curve") || zmq_curve_keypair(pub, sec) != 0)
    throw TransportError("this ZeroMQ library was built without CURVE support; cannot generate keys");
  return KeyPair{pub, sec};
}

void write_keypair(const std::string& stem, const KeyPair& kp) {
  if (!is_z85_key(kp.public_key)) throw TransportError("write_keypair: public key is not 40 Z85 characters");
  if (!is_z85_key(kp.secret_key)) throw TransportError("write_keypair: secret key is not 40 Z85 characters");
  const std::string key_path = stem + ".key", pub_path = stem + ".pub";
  // Check both before creating either, so a refusal leaves nothing half-written behind.
  std::error_code ec;
  for (const auto& p : {key_path, pub_path})
    if (fs::exists(fs::symlink_status(p, ec)))
      throw TransportError("key file " + p + " already exists; refusing to overwrite it");
  const std::string pub_line = "public-key = \"" + kp.public_key + "\"\n";
  write_new_file(key_path, "# deloco CURVE key pair: keep this file secret\n" + pub_line +
                               "secret-key = \"" + kp.secret_key + "\"\n",
                 0600);
  try {
    write_new_file(pub_path, pub_line, 0644);
  } catch (...) {
    ::unlink(key_path.c_str());
    throw;
  }
}

KeyPair read_secret_key_file(const std::string& path) {
  const KeyFileFields f = read_key_file(path);
  if (f.secret_key.empty())
    throw TransportError("key file " + path + ": no secret-key entry (is this a .pub file? pass the .key file)");
  // Derive the public key from the secret one: a hand-edited file with mismatched halves would otherwise fail
  // later as an opaque handshake error.
  char derived[kZ85KeyChars + 1];
  if (zmq_curve_public(derived, f.secret_key.c_str()) != 0)
    throw TransportError("key file " + path + ": cannot derive the public key (ZeroMQ without CURVE?)");
  if (!f.public_key.empty() && f.public_key != derived)
    throw TransportError("key file " + path + ": public-key does not belong to secret-key");
  return KeyPair{derived, f.secret_key};
}

std::string read_public_key_file(const std::string& path) {
  const KeyFileFields f = read_key_file(path);
  if (f.public_key.empty()) throw TransportError("key file " + path + ": no public-key entry");
  return f.public_key;
}

AllowList AllowList::load(const std::string& path) {
  AllowList list;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw TransportError("allow-list " + path + ": no such file or directory");
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".pub" && !e.is_directory()) files.push_back(e.path());
    if (ec) throw TransportError("allow-list " + path + ": cannot list directory: " + ec.message());
    std::sort(files.begin(), files.end());  // deterministic order for messages and tests
    for (const auto& f : files) list.entries.emplace_back(f.stem().string(), read_public_key_file(f.string()));
  } else {
    std::istringstream lines(read_text_file(path, "allow-list").text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      const std::string t = trim_space(line);
      if (t.empty() || t[0] == '#') continue;
      std::istringstream words(t);
      std::string name, key, extra;
      words >> name >> key;
      const std::string where = "allow-list " + path + " line " + std::to_string(n) + ": ";
      if (key.empty() || (words >> extra))
        throw TransportError(where + "bad format, expected \"<name> <40-character Z85 public key>\"");
      if (!is_z85_key(key))
        throw TransportError(where + "key of '" + name + "' is not 40 Z85 characters: " + describe_key(key));
      list.entries.emplace_back(name, key);
    }
  }
  if (list.entries.empty())
    throw TransportError("allow-list " + path + " has no entries" +
                         (fs::is_directory(path, ec) ? " (no <name>.pub files in the directory)" : "") +
                         "; no client could connect");
  // One key, one name: duplicates would make Envelope::identity ambiguous.
  for (size_t i = 0; i < list.entries.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      if (list.entries[i].first == list.entries[j].first)
        throw TransportError("allow-list " + path + ": name '" + list.entries[i].first + "' appears twice");
      if (list.entries[i].second == list.entries[j].second)
        throw TransportError("allow-list " + path + ": '" + list.entries[j].first + "' and '" +
                             list.entries[i].first + "' have the same public key");
    }
  return list;
}

const std::string* AllowList::name_of(const std::string& z85) const {
  for (const auto& e : entries)
    if (e.second == z85) return &e.first;
  return nullptr;
}

}  // namespace deloco
