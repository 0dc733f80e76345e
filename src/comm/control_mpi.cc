// The control channel over MPI: point-to-point messages with MPI_Isend / MPI_Iprobe, the
// agreement as one MPI_Allreduce(MAX) of the fingerprint and its negation (then, only when
// they differ, an allgather to say who issued what), MPI_Abort.
#include "comm/control_mpi.h"

#include <algorithm>
#include <cstdlib>
#include <list>
#include <mutex>

#include "core/mpi_check.h"

namespace tutti::detail {
namespace {

constexpr int kFields = 6;
using Values = std::vector<std::int64_t>;

// The fingerprint's fields, then their negations: one MAX allreduce gives every field's max
// and min, which are equal on every rank exactly when every rank has the same fingerprint.
Values max_min_of(const Fingerprint& f) {
  const std::int64_t v[kFields] = {static_cast<std::int64_t>(f.seq), f.count, f.kind, f.op, f.dtype, f.root};
  Values out(2 * kFields);
  for (int i = 0; i < kFields; ++i) {
    out[static_cast<std::size_t>(i)] = v[i];
    out[static_cast<std::size_t>(kFields + i)] = -v[i];
  }
  return out;
}

bool all_same(const Values& reduced) {
  for (int i = 0; i < kFields; ++i) {
    if (reduced[static_cast<std::size_t>(i)] != -reduced[static_cast<std::size_t>(kFields + i)]) return false;
  }
  return true;
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Its buffers stay alive until MPI is done with them: a dropped, unfinished exchange leaks them
// (its communicator is broken anyway).
class MpiPendingAgreement final : public PendingAgreement {
 public:
  MpiPendingAgreement(MPI_Comm comm, int size, const Fingerprint& mine) : comm_(comm), b_(std::make_unique<Buffers>()) {
    b_->mine = mine;
    b_->sent = max_min_of(mine);
    b_->reduced.resize(b_->sent.size());
    b_->all.resize(static_cast<std::size_t>(size));
    TUTTI_MPI_CHECK(
        MPI_Iallreduce(b_->sent.data(), b_->reduced.data(), 2 * kFields, MPI_INT64_T, MPI_MAX, comm_, &request_));
  }
  ~MpiPendingAgreement() override {
    if (request_ != MPI_REQUEST_NULL) (void)b_.release();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    TUTTI_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    if (!flag) return false;
    if (!gathering_) {
      if (all_same(b_->reduced)) {
        b_->all.clear();
        return done_ = true;
      }
      gathering_ = true;
      TUTTI_MPI_CHECK(MPI_Iallgather(&b_->mine, sizeof(Fingerprint), MPI_BYTE, b_->all.data(), sizeof(Fingerprint),
                                     MPI_BYTE, comm_, &request_));
      return false;
    }
    return done_ = true;
  }
  std::vector<Fingerprint> result() override { return b_->all; }

 private:
  struct Buffers {
    Fingerprint mine;
    Values sent, reduced;
    std::vector<Fingerprint> all;
  };
  MPI_Comm comm_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::unique_ptr<Buffers> b_;
  bool gathering_ = false, done_ = false;
};

class MpiControl final : public ControlChannel {
 public:
  explicit MpiControl(MPI_Comm parent) {
    TUTTI_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TUTTI_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    TUTTI_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiControl() override { close(/*free=*/true); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(int to, int tag, std::shared_ptr<const std::vector<char>> bytes) override {
    std::lock_guard lock(mutex_);
    if (comm_ == MPI_COMM_NULL) return;
    Outgoing o{MPI_REQUEST_NULL, std::move(bytes)};
    if (MPI_Isend(o.data->data(), static_cast<int>(o.data->size()), MPI_BYTE, to, tag, comm_, &o.request) ==
        MPI_SUCCESS) {
      outgoing_.push_back(std::move(o));
    }
  }

  std::optional<ControlMessage> poll() override {
    std::lock_guard lock(mutex_);
    if (comm_ == MPI_COMM_NULL) return std::nullopt;
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      int done = 0;
      if (MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        it = outgoing_.erase(it);
      } else {
        ++it;
      }
    }
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &st) != MPI_SUCCESS || !flag) return std::nullopt;
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    ControlMessage m{st.MPI_SOURCE, st.MPI_TAG, std::vector<char>(static_cast<std::size_t>(std::max(bytes, 0)))};
    if (MPI_Recv(m.bytes.data(), bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      return std::nullopt;
    }
    return m;
  }

  std::vector<Fingerprint> agree(const Fingerprint& mine) override {
    Values v = max_min_of(mine);
    TUTTI_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), 2 * kFields, MPI_INT64_T, MPI_MAX, comm_));
    if (all_same(v)) return {};
    std::vector<Fingerprint> all(static_cast<std::size_t>(size_));
    TUTTI_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm_));
    return all;
  }

  std::unique_ptr<PendingAgreement> start_agree(const Fingerprint& mine) override {
    return std::make_unique<MpiPendingAgreement>(comm_, size_, mine);
  }

  std::unique_ptr<ControlChannel> duplicate() override { return std::make_unique<MpiControl>(comm_); }

  const char* how_it_ends() const override { return "MPI_Abort"; }

  void end_job(const std::string&, int exit_code) noexcept override {
    if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  }

  void end_job_at_exit(const std::string&, int exit_code) noexcept override {
    // The process's own exit status wins (the program's catch chose it); 1 when it is 0.
    (void)exit_code;
    static std::once_flag registered;
    std::call_once(registered, [] {
      on_exit(
          [](int status, void*) {
            if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, status != 0 ? status : 1);
          },
          nullptr);
    });
  }

  void close(bool free) noexcept override {
    std::lock_guard lock(mutex_);
    if (comm_ == MPI_COMM_NULL) return;
    if (mpi_usable() && free) {
      for (auto& o : outgoing_) MPI_Request_free(&o.request);
      MPI_Comm_free(&comm_);
    }
    outgoing_.clear();
    comm_ = MPI_COMM_NULL;
  }

 private:
  struct Outgoing {
    MPI_Request request;
    std::shared_ptr<const std::vector<char>> data;
  };
  std::mutex mutex_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::list<Outgoing> outgoing_;
};

}  // namespace

std::unique_ptr<ControlChannel> make_mpi_control(MPI_Comm parent) { return std::make_unique<MpiControl>(parent); }

}  // namespace tutti::detail
