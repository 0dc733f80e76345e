"""The data of tutti's examples/train_gpt, reproduced in pure Python for its PyTorch peer
(torch_gpt.py) and for the test that checks both see the same tokens in the same order
(tests/examples/train_gpt_test.py): the corpus (Debian's fortunes, or text files as bytes, or
llm.c .bin shards), the train/validation split, the windows, and the data order of
tutti::data::TokenLoader, which is specified exactly in include/tutti/data/loader.h and
tokens.h:

- windows: each segment (a file of shards; all text is one segment) is cut into
  floor((len - 1) / T) windows starting every T tokens; window w holds T + 1 tokens;
- epoch e visits them in epoch_permutation(windows, seed, e): identity, then Fisher-Yates
  from i = n-1 down to 1 with j = x mod (i+1), x drawn from std::mt19937_64 seeded with
  splitmix64_mix(seed + 0x9E3779B97F4A7C15 * (e + 1)), redrawn while x < 2^64 mod (i+1);
- global micro-batch s is positions [s*B, (s+1)*B) of it, rank r takes [r*B/N, (r+1)*B/N).
"""
import os
import struct
import zlib

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
SHARD_MAGIC, SHARD_VERSION = 20240520, 1


def splitmix64_mix(z):
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class MT19937_64:
    """std::mt19937_64 (Matsumoto & Nishimura's MT19937-64, seeded as the C++ standard says)."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & MASK64
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64
        self.index = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.index = 0

    def __call__(self):
        if self.index >= 312:
            self._twist()
        x = self.mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & MASK64


def epoch_permutation(n, seed, epoch):
    order = list(range(n))
    rng = MT19937_64(splitmix64_mix(seed + GOLDEN * (epoch + 1)))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        threshold = (1 << 64) % bound
        x = rng()
        while x < threshold:
            x = rng()
        j = x % bound
        order[i], order[j] = order[j], order[i]
    return order


def fortunes_dir():
    return os.environ.get("TUTTI_FORTUNES_DIR") or "/usr/share/games/fortunes"


def default_corpus_files():
    d = fortunes_dir()
    files = sorted(os.path.join(d, f) for f in os.listdir(d)
                   if "." not in f and os.path.isfile(os.path.join(d, f))
                   and not os.path.islink(os.path.join(d, f)))
    if not files:
        raise SystemExit(f"error: no fortunes in {d}: apt-get install fortunes (scripts/setup.sh installs it)")
    return files


def read_corpus(paths):
    """(tokens: list of int, segment_starts, vocab) of text files (bytes) or llm.c shards."""
    if paths[0].endswith(".bin"):
        tokens, starts = [], []
        for p in paths:
            with open(p, "rb") as f:
                raw = f.read()
            header = struct.unpack("<256i", raw[:1024])
            if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
                raise SystemExit(f"error: {p} is not an llm.c token shard (version 1)")
            n = header[2]
            starts.append(len(tokens))
            tokens.extend(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]))
        return tokens, starts, 50257
    data = b"".join(open(p, "rb").read() for p in paths)
    return list(data), [0], 256


def split_tail(tokens, starts, fraction):
    """(train, train_starts), (val, val_starts): tutti::data::split_tail."""
    cut = len(tokens) - int(len(tokens) * fraction)
    train_starts = [s for s in starts if s < cut]
    val_starts = [0] + [s - cut for s in starts if s > cut]
    return (tokens[:cut], train_starts), (tokens[cut:], val_starts)


def windows(tokens, starts, T):
    out = []
    for k, b in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else len(tokens)
        w = b
        while w + T + 1 <= e:
            out.append(w)
            w += T
    return out


class TokenLoader:
    """tutti::data::TokenLoader: this rank's windows of each global micro-batch."""

    def __init__(self, tokens, starts, T, global_batch, rank, world, seed):
        self.tokens, self.T = tokens, T
        self.starts = windows(tokens, starts, T)
        self.B, self.rank, self.world, self.seed = global_batch, rank, world, seed
        self.local = global_batch // world
        self.steps_per_epoch = len(self.starts) // global_batch
        self.epoch, self.step = 0, 0
        self._cached = (-1, None)

    def next_windows(self):
        if self.step >= self.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0
        if self._cached[0] != self.epoch:
            self._cached = (self.epoch, epoch_permutation(len(self.starts), self.seed, self.epoch))
        order = self._cached[1]
        begin = self.step * self.B + self.rank * self.local
        self.step += 1
        return [self.starts[order[i]] for i in range(begin, begin + self.local)]

    def rows(self, window_starts):
        """[(inputs, targets)] of T tokens each."""
        return [(self.tokens[w:w + self.T], self.tokens[w + 1:w + self.T + 1]) for w in window_starts]


def tokens_crc32(rows):
    """crc32 of the inputs of a batch as little-endian int32 (train_gpt's first_batch_crc32)."""
    flat = [t for x, _ in rows for t in x]
    return zlib.crc32(struct.pack(f"<{len(flat)}i", *flat))
