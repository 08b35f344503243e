// wire/le.h — little-endian integers in byte buffers: the one place the codecs (wire.cpp, quantize.cpp) write and
// read them. Byte by byte, so any host order and any alignment give the same bytes.
#pragma once

#include <cstdint>

namespace deloco::le {

inline void put_u16(char* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
// The `bytes`-byte (at most 8) little-endian integer at p.
inline uint64_t get(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint32_t get_u32(const unsigned char* p) { return static_cast<uint32_t>(get(p, 4)); }

}  // namespace deloco::le
