// libFuzzer target: the wire decoder (deloco/wire.h) and the payload codecs behind it (wire/quantize.h), on a
// frame as a peer would send it.
//
// Input: one byte of mode, then the frame. Random bytes would almost never get past the payload checksum, so unless
// the mode's low bit is set the target first rewrites the frame's payload_bytes and checksum fields to match the
// bytes that follow the header (the "way past the checksum": the decoder itself is the production code, unchanged).
// Properties checked: decoding throws only deloco::WireError; a decoded float payload decodes into exactly
// element_count floats; a two-frame receive (decode_header + verify_payload) agrees with decode_message.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "deloco/wire.h"
#include "wire/quantize.h"

namespace {

void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_wire: property violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::string frame(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(mode & 1) && frame.size() >= deloco::kWireHeaderBytes) {
    const size_t payload = frame.size() - deloco::kWireHeaderBytes;
    put_u64(frame.data() + 56, payload);
    put_u64(frame.data() + 64, deloco::fnv1a64(frame.data() + deloco::kWireHeaderBytes, payload));
  }
  deloco::WireLimits limits;  // small, as a syncer for a small model would set them
  limits.max_elements = 1 << 16;
  limits.max_payload_bytes = 1 << 18;

  bool whole_ok = false;
  deloco::DecodedMessage m;
  try {
    m = deloco::decode_message(frame.data(), frame.size(), limits);
    whole_ok = true;
  } catch (const deloco::WireError&) {
  }

  // The two-frame path must accept exactly the frames the one-frame path accepts.
  bool split_ok = false;
  if (frame.size() >= deloco::kWireHeaderBytes) {
    try {
      deloco::MessageHeader h = deloco::decode_header(frame.data(), deloco::kWireHeaderBytes, limits);
      deloco::verify_payload(h, frame.data() + deloco::kWireHeaderBytes, frame.size() - deloco::kWireHeaderBytes);
      split_ok = true;
    } catch (const deloco::WireError&) {
    }
  }
  if (whole_ok != split_ok) fail("decode_message and decode_header+verify_payload disagree");
  if (!whole_ok) return 0;

  if (m.header.encoding != deloco::Encoding::kRaw) {
    std::vector<float> out(m.header.element_count);
    try {
      deloco::decode_floats_into(m.payload, m.payload_size, m.header.encoding, out.size(), out.data());
    } catch (const deloco::WireError&) {
      return 0;  // e.g. a non-finite scale: refused, which is allowed
    }
  }
  // Re-encoding the decoded header and payload reproduces the frame byte for byte.
  const std::string again = deloco::encode_message(m.header, m.payload, m.payload_size, limits);
  if (again != frame) fail("encode(decode(frame)) != frame");
  return 0;
}
