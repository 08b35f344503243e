// Untrusted text for logs and records (util/text.h).
#include "util/text.h"

#include <algorithm>
#include <sstream>

namespace deloco {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when the bytes there are not one (RFC 3629).
size_t sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;          // no overlong forms
    else if (c == 0xed) hi = 0x9f;     // no UTF-16 surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;          // no overlong forms
    else if (c == 0xf4) hi = 0x8f;     // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  return n;
}

constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD
constexpr std::string_view kCut = "...";

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string clip_utf8(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes && is_valid_utf8(s)) return std::string(s);
  // Room for the content when it has to be cut: keep space for the marker.
  const size_t room = max_bytes >= kCut.size() ? max_bytes - kCut.size() : max_bytes;
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  bool cut = false;
  for (size_t i = 0; i < s.size();) {
    const size_t n = sequence_length(s, i);
    const std::string_view piece = n > 0 ? s.substr(i, n) : kReplacement;
    // Would this piece (and, unless it is the last one, the marker) still fit?
    const bool last = i + (n > 0 ? n : 1) >= s.size();
    const size_t limit = last ? max_bytes : room;
    if (out.size() + piece.size() > limit) {
      cut = true;
      break;
    }
    out.append(piece);
    i += n > 0 ? n : 1;
  }
  if (cut && max_bytes >= kCut.size()) out.append(kCut);  // out holds at most `room` bytes here
  return out;
}

std::string trim_space(std::string_view s) {
  constexpr std::string_view kBlank = " \t\r\n";
  const size_t a = s.find_first_not_of(kBlank);
  if (a == std::string_view::npos) return "";
  return std::string(s.substr(a, s.find_last_not_of(kBlank) - a + 1));
}

std::string exact_number(double v) {
  std::ostringstream o;
  o.precision(9);
  o << v;
  return o.str();
}

}  // namespace deloco
