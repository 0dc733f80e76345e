#!/usr/bin/env python3
"""Turns text into llm.c token shards, which tutti reads (data::read_token_shards, train_gpt --data).

    .venv-ref/bin/python scripts/tokenize_text.py --tokenizer tokenizer.json --out data/ corpus/ more.txt

Inputs: text files and folders (every file under a folder, in name order; hidden ones left out;
--suffix keeps those with a given ending).
Each file is one document, and each document starts with the tokenizer's document token, as
llm.c's data scripts write them (GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>; --doc-token).

The tokenizer: a Hugging Face tokenizer.json (or a model's folder holding one), read by the
`tokenizers` package, offline; or tiktoken:gpt2, GPT-2's encoding through the tiktoken package
where it is installed and has its encoding file. Special tokens written in the text are encoded
as text (as llm.c's scripts do).

Outputs, named as llm.c's dev/data scripts name them: OUT/NAME_val_000000.bin (the first
--val-tokens tokens) and OUT/NAME_train_000001.bin, 000002, ... (--shard-tokens each, the last
fewer). Ids are uint16 (llm.c's GPT-2 format: magic 20240520, version 1) when the vocabulary
fits in 65,536 ids, else uint32 (its Llama 3 format: magic 20240801, version 7); --format chooses.

Documents longer than --piece-chars are encoded in pieces cut at the start of a line (pieces are
encoded in parallel), where a probe shows that this tokenizer encodes such pieces as it encodes
the whole; otherwise whole.
"""
import argparse
import array
import glob
import os
import struct
import sys
import time

FORMATS = {  # llm.c's dev/data/data_common.py
    "gpt2": {"magic": 20240520, "version": 1, "typecode": "H", "limit": 2**16, "what": "uint16 ids, llm.c's GPT-2 format"},
    "llama3": {"magic": 20240801, "version": 7, "typecode": "I", "limit": 2**32,
               "what": "uint32 ids, llm.c's Llama 3 format"},
}
DOC_TOKENS = ["<|endoftext|>", "<|begin_of_text|>", "<s>", "<bos>"]  # the first the tokenizer has
BATCH_CHARS = 8_000_000  # text encoded in one call (in parallel, by piece)
PROBE = "Hello world.\nThe quick brown fox,\n\njumps over 12 lazy dogs!\n  An indented line\n\tend.\n"


class Failure(Exception):
    """An error to print without a traceback."""


def fail(*parts):
    raise Failure("".join(str(p) for p in parts))


class Tokenizer:
    """encode(texts) -> lists of ids, without special tokens; vocab; token_id(text) or None."""

    def __init__(self, spec):
        if spec.startswith("tiktoken:"):
            self._tiktoken(spec[len("tiktoken:"):])
        else:
            self._hf(spec)

    def _hf(self, spec):
        path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
        if not os.path.isfile(path):
            fail("tokenizer '", spec, "' not found: give a Hugging Face tokenizer.json, a model's folder that holds "
                 "one, or tiktoken:gpt2")
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError:
            fail("the tokenizers package is missing: run this script with the reference environment's python, "
                 ".venv-ref/bin/python (bash scripts/setup.sh makes it), or pip install tokenizers")
        try:
            tok = HfTokenizer.from_file(path)
        except Exception as e:  # the package's own exception type differs between versions
            fail("'", path, "' is not a tokenizer.json that the tokenizers package reads: ", e)
        if hasattr(tok, "encode_special_tokens"):
            tok.encode_special_tokens = True  # "<|endoftext|>" in the text is text
        self.name = path
        self.vocab = tok.get_vocab_size(with_added_tokens=True)
        self.token_id = tok.token_to_id
        self.encode = lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    def _tiktoken(self, name):
        try:
            import tiktoken
        except ImportError:
            fail("tiktoken:", name, " needs the tiktoken package, which is not installed (pip install tiktoken "
                 "where its encoding files can be fetched); or pass GPT-2's tokenizer.json")
        try:
            enc = tiktoken.get_encoding(name)
        except Exception as e:  # unknown name, or the encoding file cannot be fetched
            fail("tiktoken cannot load the encoding '", name, "': ", e)
        self.name = "tiktoken:" + name
        self.vocab = enc.n_vocab
        self.token_id = lambda text: enc.encode_single_token(text) if text in enc.special_tokens_set else None
        self.encode = enc.encode_ordinary_batch


def pieces_are_safe(tok):
    """Whether cutting a text at line starts (a newline, then a character that is not a space)
    and encoding the pieces gives the ids of the whole (not with tokenizers that mark the start
    of a text, as SentencePiece's prepend_scheme "first" does)."""
    cuts = [0] + [i + 1 for i, c in enumerate(PROBE[:-1]) if c == "\n" and not PROBE[i + 1].isspace()] + [len(PROBE)]
    parts = [PROBE[a:b] for a, b in zip(cuts, cuts[1:])]
    return sum(tok.encode(parts), []) == tok.encode([PROBE])[0]


def cut(text, piece_chars):
    """`text` in pieces of about piece_chars, each cut at a line start (0: whole)."""
    if piece_chars <= 0 or len(text) <= piece_chars:
        return [text]
    pieces, start = [], 0
    while len(text) - start > piece_chars:
        at = start + piece_chars
        while True:
            at = text.find("\n", at)
            if at < 0 or at + 1 >= len(text) or not text[at + 1].isspace():
                break
            at += 1
        if at < 0 or at + 1 >= len(text):
            break
        pieces.append(text[start:at + 1])
        start = at + 1
    pieces.append(text[start:])
    return pieces


def input_files(inputs, suffixes):
    files = []
    for p in inputs:
        if os.path.isdir(p):
            found = []
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, n) for n in sorted(names)
                          if not n.startswith(".") and (not suffixes or n.endswith(tuple(suffixes)))]
            if not found:
                fail("folder '", p, "' holds no files", " ending in " + " or ".join(suffixes) if suffixes else "")
            files += [f for f in found if os.path.isfile(f)]
        elif os.path.isfile(p):
            files.append(p)
        else:
            fail("input '", p, "' is neither a file nor a folder")
    return files


def read_text(path, encoding):
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        fail("'", path, "' is not ", encoding, " text (byte 0x%02x at offset %d): leave it out (--suffix keeps "
             "only the files of a folder with a given ending) or pass its --encoding" % (data[e.start], e.start))


class Shards:
    """Writes ids into NAME_val_000000.bin (the first val_tokens) and NAME_train_%06d.bin."""

    def __init__(self, out, name, fmt, val_tokens, shard_tokens):
        self.out, self.name, self.fmt, self.shard_tokens = out, name, FORMATS[fmt], shard_tokens
        self.index = 0 if val_tokens > 0 else 1
        self.limit = val_tokens if val_tokens > 0 else shard_tokens
        self.buf = array.array(self.fmt["typecode"])
        self.written = []  # (path, tokens)
        self.total = 0

    def add(self, ids):
        self.total += len(ids)
        at = 0
        while at < len(ids):
            take = min(len(ids) - at, self.limit - len(self.buf))
            self.buf.extend(ids[at:at + take])
            at += take
            if len(self.buf) == self.limit:
                self.flush()

    def flush(self):
        split = "val" if self.index == 0 else "train"
        path = os.path.join(self.out, "%s_%s_%06d.bin" % (self.name, split, self.index))
        if sys.byteorder != "little":
            self.buf.byteswap()
        with open(path, "wb") as f:
            f.write(struct.pack("<256i", self.fmt["magic"], self.fmt["version"], len(self.buf), *([0] * 253)))
            f.write(self.buf.tobytes())
        self.written.append((path, len(self.buf)))
        self.index += 1
        self.limit = self.shard_tokens
        self.buf = array.array(self.fmt["typecode"])

    def close(self):
        if len(self.buf) > 0:
            self.flush()


def megabytes(n):
    return "%.1f MB" % (n / 1e6)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="text files and folders of text files")
    parser.add_argument("--tokenizer", required=True,
                        help="a tokenizer.json, a folder that holds one, or tiktoken:gpt2")
    parser.add_argument("--out", required=True, help="the folder of the shards (made if missing)")
    parser.add_argument("--name", help="the shards' name prefix (default: the first input's name)")
    parser.add_argument("--val-tokens", type=int, default=32768,
                        help="tokens of the validation shard, the first of the text (default: 32768, as llm.c's "
                             "tinyshakespeare.py; 0: none)")
    parser.add_argument("--shard-tokens", type=int, default=10**8,
                        help="tokens of each training shard (default: 10^8, as llm.c's fineweb.py)")
    parser.add_argument("--format", choices=["auto", "gpt2", "llama3"], default="auto",
                        help="gpt2: uint16 ids; llama3: uint32 ids; auto (default): gpt2 when the vocabulary "
                             "fits 65,536 ids")
    parser.add_argument("--doc-token",
                        help="the token that starts each document (default: the first of %s that the "
                             "tokenizer has; '' for none)" % ", ".join(DOC_TOKENS))
    parser.add_argument("--suffix", action="append", default=[],
                        help="of a folder, take only the files with this ending (e.g. .txt; may be repeated)")
    parser.add_argument("--encoding", default="utf-8", help="of the text files (default: utf-8)")
    parser.add_argument("--piece-chars", type=int, default=1_000_000,
                        help="encode longer documents in pieces of about this many characters, cut at line "
                             "starts (default: 1,000,000; 0: whole)")
    parser.add_argument("--progress-seconds", type=float, default=5.0,
                        help="print progress to stderr this often (default: 5)")
    parser.add_argument("--overwrite", action="store_true", help="replace shards of the same name in --out")
    args = parser.parse_args(argv)
    if args.val_tokens < 0 or args.shard_tokens <= 0:
        parser.error("--val-tokens must be at least 0 and --shard-tokens positive")
    try:
        run(args)
    except Failure as e:
        print("tokenize_text: error: %s" % e, file=sys.stderr)
        return 1
    return 0


def run(args):
    files = input_files(args.inputs, args.suffix)
    if not files:
        fail("no text files given")
    tok = Tokenizer(args.tokenizer)
    fmt = args.format if args.format != "auto" else ("gpt2" if tok.vocab <= 2**16 else "llama3")
    limit = FORMATS[fmt]["limit"]
    if tok.vocab > limit:
        fail("the vocabulary of ", tok.name, " (", tok.vocab, " ids) does not fit ", FORMATS[fmt]["what"],
             " (ids below ", limit, "): leave out --format (uint32 ids, llm.c's Llama 3 format)")
    if args.doc_token is None:
        doc = next((t for t in DOC_TOKENS if tok.token_id(t) is not None), None)
        doc_id = tok.token_id(doc) if doc else None
        if doc is None:
            print("tokenize_text: the tokenizer has none of %s: documents follow each other without a token "
                  "between them (--doc-token names one)" % ", ".join(DOC_TOKENS), file=sys.stderr)
    elif args.doc_token == "":
        doc, doc_id = None, None
    else:
        doc, doc_id = args.doc_token, tok.token_id(args.doc_token)
        if doc_id is None:
            fail("--doc-token '", doc, "' is not a token of ", tok.name)

    name = args.name or os.path.splitext(os.path.basename(os.path.normpath(args.inputs[0])))[0]
    os.makedirs(args.out, exist_ok=True)
    old = sorted(glob.glob(os.path.join(glob.escape(args.out), glob.escape(name) + "_train_*.bin")) +
                 glob.glob(os.path.join(glob.escape(args.out), glob.escape(name) + "_val_*.bin")))
    if old and not args.overwrite:
        fail("'", args.out, "' already holds ", len(old), " shard(s) named ", name, "_* (", old[0],
             "...): remove them, pass --overwrite, or another --name")
    for f in old:
        os.remove(f)

    piece_chars = args.piece_chars if pieces_are_safe(tok) else 0
    print("tokenize_text: %d file(s) with %s; vocabulary %d: %s; document token %s; %s" %
          (len(files), tok.name, tok.vocab, FORMATS[fmt]["what"], "%s (%d)" % (doc, doc_id) if doc else "none",
           "documents in pieces of about %d characters" % piece_chars if piece_chars else "documents whole"))
    shards = Shards(args.out, name, fmt, args.val_tokens, args.shard_tokens)
    total_bytes = sum(os.path.getsize(f) for f in files)
    start = last = time.monotonic()
    done = 0  # bytes of text encoded (a file's size shared among its pieces)
    pending = []  # (file, piece, whether the piece starts its document, its bytes), up to BATCH_CHARS

    def encode():
        nonlocal done, last
        for (path, piece, first, size), ids in zip(pending, tok.encode([p[1] for p in pending])):
            if ids and max(ids) >= limit:
                fail("'", path, "' encodes to id ", max(ids), ", which does not fit ", FORMATS[fmt]["what"],
                     ": leave out --format")
            if first and doc_id is not None:
                shards.add([doc_id])
            shards.add(ids)
            done += size
        pending.clear()
        now = time.monotonic()
        if now - last >= args.progress_seconds:
            last = now
            print("tokenize_text: %d%% (%s of %s), %d tokens, %d shard(s) written, %.1f MB/s"
                  % (100 * done // max(total_bytes, 1), megabytes(done), megabytes(total_bytes), shards.total,
                     len(shards.written), done / 1e6 / max(now - start, 1e-9)), file=sys.stderr, flush=True)

    chars = 0
    for path in files:
        text, size = read_text(path, args.encoding), os.path.getsize(path)
        at = given = 0  # characters into the text; of its bytes, those given to its pieces so far
        for i, piece in enumerate(cut(text, piece_chars)):
            at += len(piece)
            share = size * at // max(len(text), 1) - given  # by characters; in all, the file's size
            given += share
            pending.append((path, piece, i == 0, share))
            chars += len(piece)
            if chars >= BATCH_CHARS:
                encode()
                chars = 0
    encode()
    if shards.total <= args.val_tokens:
        for f, _ in shards.written:
            os.remove(f)
        fail("the input holds ", shards.total, " tokens, no more than --val-tokens (", args.val_tokens,
             "): none would be left to train on; pass a smaller --val-tokens")
    shards.close()
    for path, n in shards.written:
        print("tokenize_text: wrote %d tokens to %s" % (n, path))
    print("tokenize_text: %d tokens of %s in %.1f s: %d shard(s) in %s (%s)" %
          (shards.total, megabytes(total_bytes), time.monotonic() - start, len(shards.written), args.out,
           FORMATS[fmt]["what"]))


if __name__ == "__main__":
    sys.exit(main())
