#!/usr/bin/env python3
"""scripts/tokenize_text.py against tutti's reader (unittest, with the reference environment's
python: tutti_add_ref_test). Tokenizers are built here, offline: a byte-level BPE of 300 ids
trained on a few KB of this repository's docs (uint16 ids, llm.c's GPT-2 format), and a word-level
tokenizer of 70,000 ids whose words of the text lie above 65,535 (uint32 ids, its Llama 3 format).
Text goes through the script into shards, and the ids that data::read_token_shards reads back
(dump_tokens, a C++ program) must be the tokenizer's own encoding of each document, after the
document token; the shards must be split and named as llm.c names them; errors must say what is
wrong.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import unittest

ARGS = None
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "tokenize_text.py")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402


def docs_text(n):
    """n characters of real text: the start of this repository's docs."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    with open(os.path.join(ROOT, "docs", "development.md"), encoding="utf-8") as f:
        text += f.read()
    return text[:n]


def bpe_tokenizer(path, text):
    """A byte-level BPE of 300 ids (256 bytes, <|endoftext|>, merges) trained on `text`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.save(path)
    return Tokenizer.from_file(path)


def large_vocab_tokenizer(path, text, size=70000):
    """A word-level tokenizer of `size` ids whose words of `text` (and <|begin_of_text|>, Llama 3's
    document token) have the highest ids: they need 32 bits."""
    words = sorted({word for word, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text)})
    fill = ["filler%d" % i for i in range(size - len(words) - 2)]
    vocab = {w: i for i, w in enumerate(["[UNK]"] + fill + words + ["<|begin_of_text|>"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|begin_of_text|>"])
    tok.save(path)
    return Tokenizer.from_file(path)


def run_script(*args, expect=0):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        raise AssertionError("tokenize_text.py %s exited %d, expected %d:\n%s\n%s"
                             % (" ".join(args), p.returncode, expect, p.stdout, p.stderr))
    return p


def read_back(shards, vocab=None):
    """What data::read_token_shards reads: (ids, summary dict)."""
    out = os.path.join(ARGS.workdir, "dump.u32")
    cmd = [ARGS.dump] + (["--vocab", str(vocab)] if vocab else []) + [out] + shards
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stderr))
    words = p.stdout.split()
    summary = dict(zip(words[0::2], words[1::2]))
    with open(out, "rb") as f:
        data = f.read()
    return list(struct.unpack("<%dI" % (len(data) // 4), data)), summary


def header(path):
    with open(path, "rb") as f:
        return struct.unpack("<3i", f.read(12))


class TokenizeText(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.join(ARGS.workdir, self._testMethodName)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(os.path.join(self.dir, "text", "sub"))
        text = docs_text(30000)
        # Three documents: two in a folder (one of them in a subfolder), one file given alone.
        self.docs = [text[:9000], text[9000:21000], text[21000:]]
        self.files = [os.path.join(self.dir, "text", "a.txt"), os.path.join(self.dir, "text", "sub", "b.txt"),
                      os.path.join(self.dir, "c.txt")]
        for path, doc in zip(self.files, self.docs):
            with open(path, "w", encoding="utf-8") as f:
                f.write(doc)
        with open(os.path.join(self.dir, "text", ".hidden"), "w") as f:
            f.write("left out")
        self.text = text

    def shards(self, name):
        out = os.path.join(self.dir, "out")
        val = sorted(f for f in os.listdir(out) if f.startswith(name + "_val_"))
        train = sorted(f for f in os.listdir(out) if f.startswith(name + "_train_"))
        return [os.path.join(out, f) for f in val], [os.path.join(out, f) for f in train]

    def test_uint16_shards_hold_the_tokenizers_ids(self):
        path = os.path.join(self.dir, "bpe.json")
        tok = bpe_tokenizer(path, self.text)
        self.assertEqual(tok.get_vocab_size(), 300)
        eot = tok.token_to_id("<|endoftext|>")
        expected = []
        for doc in self.docs:
            expected += [eot] + tok.encode(doc, add_special_tokens=False).ids
        p = run_script("--tokenizer", path, "--out", os.path.join(self.dir, "out"), "--val-tokens", "1000",
                       "--shard-tokens", "4000", "--progress-seconds", "0",
                       os.path.join(self.dir, "text"), self.files[2])
        self.assertIn("vocabulary 300: uint16 ids", p.stdout)
        self.assertIn("document token <|endoftext|> (%d)" % eot, p.stdout)
        self.assertRegex(p.stderr, r"tokenize_text: 100% \(")  # progress
        val, train = self.shards("text")  # named after the first input
        self.assertEqual([os.path.basename(f) for f in val], ["text_val_000000.bin"])
        self.assertEqual(os.path.basename(train[0]), "text_train_000001.bin")
        self.assertEqual(len(train), -(-(len(expected) - 1000) // 4000))
        for f in val + train:
            self.assertEqual(header(f)[:2], (20240520, 1))
        ids, summary = read_back(val + train)
        self.assertEqual(summary["width"], "2")
        self.assertEqual(summary["vocab"], "50257")  # the reader's default for uint16 shards
        self.assertEqual(ids, expected)
        sizes = [header(f)[2] for f in val + train]
        self.assertEqual(sizes[:-1], [1000] + [4000] * (len(train) - 1))
        self.assertEqual(summary["segments"], ",".join(str(sum(sizes[:i])) for i in range(len(sizes))))
        self.assertEqual(read_back(val + train, vocab=300)[0], expected)

        # Documents cut into pieces at line starts encode as whole ones (a byte-level BPE).
        p = run_script("--tokenizer", path, "--out", os.path.join(self.dir, "out"), "--name", "pieces",
                       "--val-tokens", "0", "--piece-chars", "500", *self.files)
        self.assertIn("documents in pieces of about 500 characters", p.stdout)
        val, train = self.shards("pieces")
        self.assertEqual((val, len(train)), ([], 1))
        self.assertEqual(read_back(train)[0], expected)

    def test_uint32_shards_hold_ids_above_65535(self):
        path = os.path.join(self.dir, "words.json")
        tok = large_vocab_tokenizer(path, "\n".join(self.docs))  # the words of each document
        self.assertEqual(tok.get_vocab_size(), 70000)
        bot = tok.token_to_id("<|begin_of_text|>")
        expected = []
        for doc in self.docs:
            expected += [bot] + tok.encode(doc, add_special_tokens=False).ids
        self.assertGreater(min(expected), 65535)
        self.assertNotIn(0, expected)  # no unknown word
        run_script("--tokenizer", path, "--out", os.path.join(self.dir, "out"), "--name", "llama", "--val-tokens",
                   "500", "--shard-tokens", "2000", *self.files)
        val, train = self.shards("llama")
        for f in val + train:
            self.assertEqual(header(f)[:2], (20240801, 7))
        ids, summary = read_back(val + train)
        self.assertEqual(summary["width"], "4")
        self.assertEqual(summary["vocab"], "128256")  # the reader's default for uint32 shards
        self.assertEqual(ids, expected)
        # The reader's vocabulary check sees the ids as they are.
        p = subprocess.run([ARGS.dump, "--vocab", "65536", os.path.join(ARGS.workdir, "x.u32")] + val,
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 1)
        self.assertIn("outside the vocabulary of 65536", p.stderr)
        self.assertIn(val[0], p.stderr)
        # Forced into uint16 ids, the vocabulary does not fit.
        p = run_script("--tokenizer", path, "--out", os.path.join(self.dir, "out"), "--name", "forced", "--format",
                       "gpt2", *self.files, expect=1)
        self.assertIn("(70000 ids) does not fit uint16 ids", p.stderr)

    def test_errors_say_what_is_wrong(self):
        out = os.path.join(self.dir, "out")
        p = run_script("--tokenizer", os.path.join(self.dir, "none.json"), "--out", out, *self.files, expect=1)
        self.assertIn("none.json' not found", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        p = run_script("--tokenizer", self.dir, "--out", out, *self.files, expect=1)  # a folder without one
        self.assertIn("not found", p.stderr)
        with open(os.path.join(self.dir, "bad.json"), "w") as f:
            f.write("{}")
        p = run_script("--tokenizer", os.path.join(self.dir, "bad.json"), "--out", out, *self.files, expect=1)
        self.assertIn("is not a tokenizer.json", p.stderr)

        path = os.path.join(self.dir, "bpe.json")
        bpe_tokenizer(path, self.text)
        p = run_script("--tokenizer", path, "--out", out, "--val-tokens", "100000", *self.files, expect=1)
        self.assertIn("no more than --val-tokens (100000)", p.stderr)
        self.assertFalse(os.path.exists(out) and os.listdir(out), "no shard is left behind")
        p = run_script("--tokenizer", path, "--out", out, "--doc-token", "<nope>", *self.files, expect=1)
        self.assertIn("--doc-token '<nope>' is not a token", p.stderr)
        p = run_script("--tokenizer", path, "--out", out, os.path.join(self.dir, "missing.txt"), expect=1)
        self.assertIn("is neither a file nor a folder", p.stderr)
        with open(os.path.join(self.dir, "binary.txt"), "wb") as f:
            f.write(b"text, then \xff\xfe")
        p = run_script("--tokenizer", path, "--out", out, os.path.join(self.dir, "binary.txt"), expect=1)
        self.assertIn("is not utf-8 text (byte 0xff at offset 11)", p.stderr)

        # An earlier run's shards are not mixed with this one's.
        run_script("--tokenizer", path, "--out", out, "--val-tokens", "100", *self.files)
        p = run_script("--tokenizer", path, "--out", out, "--val-tokens", "100", *self.files, expect=1)
        self.assertIn("already holds", p.stderr)
        run_script("--tokenizer", path, "--out", out, "--val-tokens", "100", "--overwrite", *self.files)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", required=True, help="the dump_tokens program (tests/data/dump_tokens.cc)")
    parser.add_argument("--workdir", required=True)
    ARGS, rest = parser.parse_known_args()
    os.makedirs(ARGS.workdir, exist_ok=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
