// The agreement carried in band and the allreduce that carries it (see InBand in mpi_engine.h).
//
// Why: a separate agreement round before each large collective is one more point where every
// rank waits for the slowest. With ranks sharing cores it cost 4-16% of a large allreduce at
// 3-4 ranks, whatever its transport (docs/benchmarks.md, "Oversubscribed"). In band, a rank
// waits only for the peers it exchanges data with, as in MPI's own algorithm.
//
// Why it is safe: Open MPI 4.1 does not check the size of a large message against the receive
// posted for it (backend.h). Here no receive is posted from a peer before that peer's
// fingerprint (seq, kind, op, dtype, count, root) has arrived and equals this rank's, and the
// algorithm's message sizes follow from the fingerprint and the world size alone; every data
// receive's size is checked too (MPI_Get_count).
#include <cstring>

#include "comm/mpi_engine.h"
#include "core/mpi_check.h"

namespace tutti::detail::mpi_engine {
namespace {

int as_int(std::int64_t n) {
  TUTTI_CHECK(n >= 0 && n <= INT32_MAX, "in-band message of ", n, " elements");
  return static_cast<int>(n);
}

}  // namespace

InBand::InBand(MPI_Comm comm, int rank, int size, const Fingerprint& mine, int tag)
    : comm_(comm),
      rank_(rank),
      size_(size),
      tag_(tag),
      mine_(mine),
      theirs_(static_cast<std::size_t>(size)),
      reqs_(static_cast<std::size_t>(size) + 2, MPI_REQUEST_NULL),
      sends_(static_cast<std::size_t>(size), MPI_REQUEST_NULL),
      seen_(static_cast<std::size_t>(size), 0) {
  theirs_[static_cast<std::size_t>(rank)] = mine;
  seen_[static_cast<std::size_t>(rank)] = 1;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const auto i = static_cast<std::size_t>(p);
    TUTTI_MPI_CHECK(MPI_Irecv(&theirs_[i], sizeof(Fingerprint), MPI_BYTE, p, tag_, comm_, &reqs_[i]));
    ++missing_;
  }
  // To the next ranks first: each rank's first peer is its neighbour above.
  for (int k = 1; k < size; ++k) {
    const int p = (rank + k) % size;
    TUTTI_MPI_CHECK(
        MPI_Isend(&mine_, sizeof(Fingerprint), MPI_BYTE, p, tag_, comm_, &sends_[static_cast<std::size_t>(p)]));
  }
}

InBand::~InBand() {
  // Left by an error: nothing that MPI could still write into may outlive this.
  for (std::size_t i = 0; i < reqs_.size(); ++i) {
    if (reqs_[i] == MPI_REQUEST_NULL) continue;
    if (i == static_cast<std::size_t>(size_) + 1) {
      MPI_Request_free(&reqs_[i]);  // a send: Open MPI cannot cancel one; it stays unmatched (its tag is unique)
    } else {
      MPI_Cancel(&reqs_[i]);
      MPI_Wait(&reqs_[i], MPI_STATUS_IGNORE);
    }
  }
  for (auto& r : sends_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // eager: delivered already
  }
}

void InBand::arrived(int peer) {
  seen_[static_cast<std::size_t>(peer)] = 1;
  --missing_;
  if (!same(theirs_[static_cast<std::size_t>(peer)], mine_)) mismatch();
}

void InBand::mismatch() {
  // Every rank sent its fingerprint before any data: waiting for the rest cannot hang on a
  // rank that is in this protocol (one that issued a collective without agreement is ended by
  // the deadline, as without the protocol).
  TUTTI_MPI_CHECK(MPI_Waitall(size_, reqs_.data(), MPI_STATUSES_IGNORE));
  if (reqs_[static_cast<std::size_t>(size_)] != MPI_REQUEST_NULL) {
    MPI_Cancel(&reqs_[static_cast<std::size_t>(size_)]);
    MPI_Wait(&reqs_[static_cast<std::size_t>(size_)], MPI_STATUS_IGNORE);
  }
  throw_mismatch(theirs_);
}

void InBand::require(int peer) {
  while (!seen_[static_cast<std::size_t>(peer)]) {
    int index = MPI_UNDEFINED;
    TUTTI_MPI_CHECK(MPI_Waitany(size_, reqs_.data(), &index, MPI_STATUS_IGNORE));
    if (index == MPI_UNDEFINED) break;
    arrived(index);
  }
}

void InBand::require_all() {
  while (missing_ > 0) {
    int index = MPI_UNDEFINED;
    TUTTI_MPI_CHECK(MPI_Waitany(size_, reqs_.data(), &index, MPI_STATUS_IGNORE));
    if (index == MPI_UNDEFINED) break;
    arrived(index);
  }
  TUTTI_MPI_CHECK(MPI_Waitall(size_, sends_.data(), MPI_STATUSES_IGNORE));
}

void InBand::wait_data(std::int64_t rcount, MPI_Datatype type, int peer) {
  const auto recv = static_cast<std::size_t>(size_);
  const int n = missing_ > 0 ? size_ + 2 : 2;
  MPI_Request* reqs = missing_ > 0 ? reqs_.data() : reqs_.data() + size_;
  const int offset = missing_ > 0 ? 0 : size_;
  while (reqs_[recv] != MPI_REQUEST_NULL || reqs_[recv + 1] != MPI_REQUEST_NULL) {
    int index = MPI_UNDEFINED;
    MPI_Status status;
    TUTTI_MPI_CHECK(MPI_Waitany(n, reqs, &index, &status));
    if (index == MPI_UNDEFINED) break;
    index += offset;
    if (index < size_) {
      arrived(index);
    } else if (index == size_) {
      int got = 0;
      TUTTI_MPI_CHECK(MPI_Get_count(&status, type, &got));
      TUTTI_CHECK(got == rcount, "collective #", mine_.seq, ": rank ", rank_, " received ", got, " elements from rank ",
                  peer, " but expected ", rcount);
    }
  }
}

void InBand::exchange(int peer, const void* send, std::int64_t scount, void* recv, std::int64_t rcount,
                      MPI_Datatype type) {
  require(peer);
  const auto r = static_cast<std::size_t>(size_);
  TUTTI_MPI_CHECK(MPI_Irecv(recv, as_int(rcount), type, peer, tag_ + 1, comm_, &reqs_[r]));
  TUTTI_MPI_CHECK(MPI_Isend(send, as_int(scount), type, peer, tag_ + 1, comm_, &reqs_[r + 1]));
  wait_data(rcount, type, peer);
}

void InBand::send(int peer, const void* buf, std::int64_t count, MPI_Datatype type) {
  require(peer);
  TUTTI_MPI_CHECK(
      MPI_Isend(buf, as_int(count), type, peer, tag_ + 1, comm_, &reqs_[static_cast<std::size_t>(size_) + 1]));
  wait_data(0, type, peer);
}

void InBand::recv(int peer, void* buf, std::int64_t count, MPI_Datatype type) {
  require(peer);
  TUTTI_MPI_CHECK(MPI_Irecv(buf, as_int(count), type, peer, tag_ + 1, comm_, &reqs_[static_cast<std::size_t>(size_)]));
  wait_data(count, type, peer);
}

// As Open MPI's ompi_coll_base_allreduce_intra_redscat_allgather (4.1): the ranks above the
// largest power of two p' fold into their neighbours first (2r ranks pair up, r = size - p'),
// a reduce-scatter by recursive halving and an allgather by recursive doubling among p' ranks,
// and the folded ranks get the result from their neighbours. Out of place, the first step
// reads `in` and receives into `out`, reducing there (out = in (op) out), so that the input
// is never copied (a copy of the whole buffer cost ~20% at 4 MiB).
void allreduce_in_band(InBand& band, int rank, int size, const void* in_ptr, void* out_ptr, std::int64_t count,
                       DType dtype, ReduceOp op, std::vector<char>& scratch) {
  MPI_Datatype type = MPI_FLOAT;
  switch (dtype) {
    case DType::f32: break;
    case DType::i32: type = MPI_INT32_T; break;
    case DType::i64: type = MPI_INT64_T; break;
    default: TUTTI_THROW(Error, "allreduce in band: ", name_of(dtype), " is reduced as f32 by its caller");
  }
  MPI_Op mop = MPI_SUM;
  if (op == ReduceOp::max) mop = MPI_MAX;
  if (op == ReduceOp::min) mop = MPI_MIN;
  // acc = in (op) acc, by MPI's own (vectorized) reduction. Each element of the result is
  // reduced by one rank only and copied to the others, so every rank gets the same bits.
  auto reduce = [&](char* acc, const char* in, std::int64_t n) {
    TUTTI_MPI_CHECK(MPI_Reduce_local(in, acc, static_cast<int>(n), type, mop));
  };
  const auto es = static_cast<std::int64_t>(size_of(dtype));
  char* const out = static_cast<char*>(out_ptr);
  const char* const in = static_cast<const char*>(in_ptr);
  auto at = [&](std::int64_t i) { return out + i * es; };
  auto in_at = [&](std::int64_t i) { return in + i * es; };
  // Until the first reduction, a rank's data is `in` (out of place) or `out` (in place).
  bool fresh = in != out;
  char* tmp = nullptr;
  auto scratch_for = [&](std::int64_t n) {
    const auto bytes = static_cast<std::size_t>(n * es);
    if (scratch.size() < bytes) scratch.resize(bytes);
    return scratch.data();
  };
  // Receives `rcount` elements from `peer` and reduces them into out[rindex...], sending
  // `scount` from [sindex...].
  auto exchange_reduce = [&](int peer, std::int64_t sindex, std::int64_t scount, std::int64_t rindex,
                             std::int64_t rcount) {
    if (fresh) {
      band.exchange(peer, in_at(sindex), scount, at(rindex), rcount, type);
      reduce(at(rindex), in_at(rindex), rcount);
    } else {
      if (tmp == nullptr) tmp = scratch_for((count + 1) / 2);
      band.exchange(peer, at(sindex), scount, tmp, rcount, type);
      reduce(at(rindex), tmp, rcount);
    }
  };

  int pof2 = 1, steps = 0;
  while (pof2 * 2 <= size) {
    pof2 *= 2;
    ++steps;
  }
  const int rem = size - pof2;
  int vrank = rank - rem;
  if (rank < 2 * rem) {
    const std::int64_t lhalf = count / 2, rhalf = count - lhalf;
    if (rank % 2 != 0) {  // reduces the right half, gives it to rank - 1, and sits out
      exchange_reduce(rank - 1, 0, lhalf, lhalf, rhalf);
      band.send(rank - 1, at(lhalf), rhalf, type);
      vrank = -1;
    } else {
      exchange_reduce(rank + 1, lhalf, rhalf, 0, lhalf);
      band.recv(rank + 1, at(lhalf), rhalf, type);
      vrank = rank / 2;
    }
    fresh = false;
  }
  if (vrank != -1) {
    std::int64_t rindex[32], sindex[32], rcount[32], scount[32];
    std::int64_t wsize = count;
    int step = 0;
    rindex[0] = sindex[0] = 0;
    auto real = [&](int v) { return v < rem ? v * 2 : v + rem; };
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int dest = real(vrank ^ mask);
      if (rank < dest) {  // keep (and reduce) the left half of the window
        rcount[step] = wsize / 2;
        scount[step] = wsize - rcount[step];
        sindex[step] = rindex[step] + rcount[step];
      } else {
        scount[step] = wsize / 2;
        rcount[step] = wsize - scount[step];
        rindex[step] = sindex[step] + scount[step];
      }
      exchange_reduce(dest, sindex[step], scount[step], rindex[step], rcount[step]);
      fresh = false;
      if (step + 1 < steps) {
        rindex[step + 1] = sindex[step + 1] = rindex[step];
        wsize = rcount[step];
        ++step;
      }
    }
    for (int mask = pof2 >> 1; mask > 0; mask >>= 1) {
      const int dest = real(vrank ^ mask);
      band.exchange(dest, at(rindex[step]), rcount[step], at(sindex[step]), scount[step], type);
      --step;
    }
  }
  if (rank < 2 * rem) {
    if (rank % 2 != 0) {
      band.recv(rank - 1, out, count, type);
    } else {
      band.send(rank + 1, out, count, type);
    }
  }
}

}  // namespace tutti::detail::mpi_engine
