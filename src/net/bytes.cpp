// Bytes: an immutable view plus the object that keeps its storage alive (see deloco/transport.h).
#include <stdexcept>
#include <string>

#include "deloco/transport.h"

namespace deloco {

Bytes Bytes::from_string(std::string s) {
  // The string moves into shared storage; data() stays valid for as long as any copy of the Bytes lives.
  auto owner = std::make_shared<const std::string>(std::move(s));
  return Bytes(owner, owner->data(), owner->size());
}

Bytes Bytes::slice(size_t offset, size_t size) const {
  if (offset > size_ || size > size_ - offset)
    throw std::out_of_range("Bytes::slice(" + std::to_string(offset) + ", " + std::to_string(size) + ") of " +
                            std::to_string(size_) + " bytes");
  return Bytes(owner_, data_ + offset, size);
}

Bytes Bytes::copy(const void* data, size_t size) {
  return from_string(std::string(static_cast<const char*>(data), size));
}

}  // namespace deloco
