// util/text.h — putting text that came from outside (a peer's message, a file) into logs, records and errors.
//
// Contract
//  * clip_utf8(s, max_bytes) returns valid UTF-8 of at most max_bytes bytes: s itself when it is valid UTF-8 and
//    fits; otherwise every invalid byte sequence is replaced by U+FFFD, and a text that is too long is cut at a
//    character boundary (never inside a multi-byte character) and ends with "..." to show it was cut.
//    max_bytes below 3 yields at most max_bytes bytes with no marker. Pure, reentrant, never throws (short of
//    std::bad_alloc).
//  * This is the one helper that cuts untrusted text: use it wherever peer- or file-supplied text is shortened or
//    put into a JSON record (nlohmann::json refuses invalid UTF-8 when dumping).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace deloco {

std::string clip_utf8(std::string_view s, size_t max_bytes);

// True when s is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view s);

// s without the spaces, tabs, carriage returns and newlines at either end (a line of a file, a field of it).
std::string trim_space(std::string_view s);

// v in decimal with 9 significant digits: enough to tell any two floats apart (an error naming a value).
std::string exact_number(double v);

}  // namespace deloco
