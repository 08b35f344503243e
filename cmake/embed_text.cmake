# Writes the text of IN as one C++ raw string literal into OUT (for #include in a definition), so a file from the
# source tree (configs/demo.toml) is compiled into the binary. Run with: cmake -DIN=... -DOUT=... -P embed_text.cmake
file(READ "${IN}" content)
string(FIND "${content}" ")deloco_text\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )deloco_text\"")
endif()
file(WRITE "${OUT}.tmp" "R\"deloco_text(${content})deloco_text\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
