// train_gpt's data: which corpus, its train/validation split, and how tokens turn back into
// text for the generated sample.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tutti/tutti.h>

namespace example {

// The default corpus: the fortune cookies of Debian's `fortunes` package (about 2.5 MB of
// English text: quotations, poems, jokes, definitions), every plain file of
// /usr/share/games/fortunes in name order. Real text that ships in a package
// (scripts/setup.sh installs it), so the first run downloads nothing.
// $TUTTI_FORTUNES_DIR moves the folder.
std::string fortunes_dir();
std::vector<std::string> default_corpus_files();

struct GptData {
  tutti::data::TokenCorpus train, val;
  bool bytes = true;  // byte-level (vocab 256) or llm.c token shards (GPT-2's or Llama 3's vocabulary)
  std::string description;
};

// `paths` empty: the default corpus. Files ending in .bin are llm.c token shards, anything
// else is read as bytes (all of one kind). Validation: `val_paths` when given, else the last
// `val_fraction` of the corpus.
GptData load_gpt_data(const std::vector<std::string>& paths, const std::vector<std::string>& val_paths,
                      double val_fraction);

// Decodes tokens for printing: bytes as they are; GPT-2 tokens through llm.c's tokenizer
// file (gpt2_tokenizer.bin: a header of 256 uint32 with magic 20240328, then per token one
// length byte and the bytes) when one is given, else as "<id>" numbers.
class Detokenizer {
 public:
  Detokenizer(bool bytes, const std::string& tokenizer_path);
  std::string decode(const std::vector<std::int32_t>& tokens) const;
  // The token ids of `text` for a byte-level model (every byte one token).
  static std::vector<std::int32_t> bytes_of(const std::string& text);

 private:
  bool bytes_;
  std::vector<std::string> pieces_;
};

}  // namespace example
