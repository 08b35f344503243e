// `deloco tokenize`: SentencePiece BPE token files from a text corpus (data/tokenizer.h).
#include <iomanip>
#include <iostream>
#include <memory>
#include <thread>

#include "commands.h"
#include "common.h"
#include "data/tokenizer.h"
#include "deloco/gpt/data.h"

namespace deloco::cli {

void add_tokenize_command(CLI::App& app) {
  struct Args {
    std::string input, out;
    int64_t vocab = 4096;
    double val_fraction = 0.05;
    int64_t threads = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "train a SentencePiece BPE tokenizer on a text corpus and write llm.c token files for data.format = \"tokens\"");
  cmd->add_option("--input", a->input, "UTF-8 text file or folder (split into train/val as data.format = \"text\" does)")->required();
  cmd->add_option("--out", a->out, "output folder: train.bin, val.bin, tokenizer.model, tokens.json")->required();
  cmd->add_option("--vocab", a->vocab, "tokenizer vocabulary size (260..65536)")->check(CLI::Range(260, 65536));
  cmd->add_option("--val-fraction", a->val_fraction, "share of the documents held out for validation")->check(CLI::Range(0.0001, 0.4999));
  cmd->add_option("--threads", a->threads, "threads for SentencePiece training (0: one per core)")->check(CLI::NonNegativeNumber);
  cmd->callback([a] {
    DataConfig text;
    text.path = a->input;
    text.val_fraction = a->val_fraction;
    const int64_t threads = a->threads > 0 ? a->threads : std::max(1u, std::thread::hardware_concurrency());
    const TokenizeReport r = tokenize_corpus(text, a->vocab, a->out, threads);
    std::cout << std::fixed << std::setprecision(2) << "tokenizer: " << r.vocab_size << " BPE pieces, trained in "
              << r.train_seconds << " s; encoded in " << r.encode_seconds << " s\n"
              << "train.bin: " << r.train_tokens << " tokens from " << r.train_bytes << " bytes ("
              << static_cast<double>(r.train_bytes) / static_cast<double>(r.train_tokens) << " bytes/token)\n"
              << "val.bin:   " << r.val_tokens << " tokens from " << r.val_bytes << " bytes\n"
              << "train on it with --set data.format=tokens --set data.path=" << a->out
              << " --set model.vocab_size=" << r.vocab_size << "\n";
  });
}

}  // namespace deloco::cli
