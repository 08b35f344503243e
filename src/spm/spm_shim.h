// src/spm/spm_shim.h — the C interface of libdeloco_spm, the one place that links SentencePiece.
//
// Why a separate library: Debian's libsentencepiece carries its own protobuf 3.14 and exports its symbols, while
// libtorch loads the system's libprotobuf 3.21. Linked into one program, the two collide at start-up (a crash in
// protobuf's static initialisers) or refuse each other ("compiled against version 3.14.0"). src/data/tokenizer.cpp
// therefore dlopen()s this library with RTLD_LOCAL | RTLD_DEEPBIND, so SentencePiece binds to its own protobuf and
// nothing of it enters the program's global symbol scope.
//
// Contract: every function returns 0 on success; on failure it returns non-zero and sets *err to a malloc'ed
// message (free it with dspm_free). Buffers it hands out are malloc'ed and freed with dspm_free. Handles are
// immutable after creation and may be used from several threads.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dspm_text {
  const char* data;
  size_t size;
} dspm_text;

// Loads a model from its serialized bytes (the content of tokenizer.model).
int dspm_load(const char* proto, size_t size, void** handle, char** err);
// Trains a BPE model on `sentences` with the given "key=value" options (SentencePiece's trainer flags), and
// returns its serialized bytes.
int dspm_train(const dspm_text* sentences, size_t count, const dspm_text* options, size_t num_options, char** proto,
               size_t* proto_size, char** err);
int dspm_piece_size(const void* handle);
int dspm_piece_to_id(const void* handle, const char* piece);  // -1 when the piece is not in the vocabulary
int dspm_encode(const void* handle, const char* text, size_t size, int** ids, size_t* count, char** err);
int dspm_decode(const void* handle, const int* ids, size_t count, char** text, size_t* size, char** err);
void dspm_close(void* handle);
void dspm_free(void* p);

#ifdef __cplusplus
}
#endif
