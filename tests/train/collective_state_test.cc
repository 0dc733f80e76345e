// train::State::add_collective (ranks as threads): when a checkpoint is written every rank runs
// the entry's save() (so it may communicate, as ddp::DiLoCo's does), rank 0's result goes into
// the file and comes back to every rank on a resume; memory snapshots refuse such a State. An
// entry registered with State::add(Entry) and not_in_snapshots (as PowerSGD's is) is taken with
// snapshots instead: they never call its save(), and a resume from one leaves it alone and says
// so in the note.
#include <gtest/gtest.h>

#include "train_program.h"
#include "tutti/core/error.h"
#include "tutti/core/state_dict.h"

namespace tutti::train::testing {
namespace {

// A state whose state_dict() is collective: the sum of (rank + 1) over the ranks, and the rank.
struct Collective {
  Communicator* comm = nullptr;
  int rank = 0;
  int saves = 0;
  std::int64_t loaded = -1;  // sum · 100 + the saving rank
  StateDict state_dict() {
    ++saves;
    Tensor sum = Tensor::from_ints({rank + 1}, {1}, DType::i64);
    comm->allreduce(sum, ReduceOp::sum).wait();
    return {{"sum", sum}, {"rank", int_scalar_tensor(rank)}};
  }
  void load_state_dict(const StateDict& s) { loaded = get_int_scalar(s, "sum") * 100 + get_int_scalar(s, "rank"); }
};

class CollectiveState : public RunDirTest {
 protected:
  // `steps` steps of 2 ranks with a checkpoint every 2; returns each rank's entry.
  // With `left_out` the entry is registered by State::add(Entry) with that not_in_snapshots;
  // `stop_after` > 0 ends the run after that step without a checkpoint (a crash); note: rank 0's.
  std::vector<Collective> train(std::int64_t steps, Resume resume, std::int64_t snapshot_every = 0,
                                const std::string& left_out = "", std::int64_t stop_after = 0) {
    kernels::set_cpu_threads(1);
    ThreadGroup group(2, CommOptions{.timeout = std::chrono::seconds(20)});
    std::vector<Collective> out(2);
    group.run([&](int rank) {
      Communicator& comm = group.communicator(rank);
      nn::Sequential model;
      model.add<nn::Linear>(kIn, kClasses);
      model.init(11);
      ddp::DistributedDataParallel ddp(comm, model);
      optim::SGD optimizer(model.parameters(), {.lr = 0.05f});
      ddp.attach(optimizer);
      amp::LossScaler scaler(amp::LossScalerOptions{.mode = amp::ScalerMode::off});
      Collective& c = out[static_cast<std::size_t>(rank)];
      c.comm = &comm;
      c.rank = rank;
      State state(ddp, optimizer, scaler);
      if (left_out.empty()) {
        state.add_collective("c.", c);
      } else {
        state.add(State::Entry{"c.", [&c] { return c.state_dict(); },
                               [&c](const StateDict& saved) {
                                 c.load_state_dict(saved);
                                 return std::string();
                               },
                               true, left_out});
      }
      RunOptions o;
      o.steps = steps;
      o.checkpoint_dir = ckpt_dir();
      o.checkpoint_every = 2;
      o.checkpoint_mode = io::CheckpointMode::sync;
      o.resume = resume;
      o.snapshots.every = snapshot_every;
      o.snapshots.dir = memory();
      o.snapshots.nodes = {0, 1};
      o.metadata["model"] = "linear";
      train::Run run(comm, state, o);
      if (rank == 0) note = run.note();
      const data::Dataset data = dataset();
      nn::CrossEntropyLoss loss;
      while (run.next()) {
        loss.forward(ddp.forward(data.images.view(rank * 12 * kIn, {12, kIn})), data.labels.view(rank * 12, {12}));
        run.add_loss(loss.loss());
        ddp.backward(loss.grad());
        optimizer.step();
        ddp.zero_grad();
        if (run.end_step().step == stop_after) return;  // a crash: no finish(), no checkpoint of its own
      }
      run.finish();
    });
    return out;
  }
  std::string note;
};

TEST_F(CollectiveState, EveryRankSavesAndRankZerosResultComesBack) {
  const std::vector<Collective> first = train(3, Resume::no);  // checkpoints after steps 2 and 3
  for (const Collective& c : first) EXPECT_EQ(c.saves, 2) << "rank " << c.rank;
  const std::vector<Collective> resumed = train(4, Resume::yes);
  for (const Collective& c : resumed) EXPECT_EQ(c.loaded, 300) << "rank " << c.rank;  // sum 1 + 2, rank 0's
}

TEST_F(CollectiveState, MemorySnapshotsRefuseIt) {
  try {
    train(3, Resume::no, 2);
    ADD_FAILURE() << "memory snapshots with a collective entry were not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--snapshot-every"), std::string::npos) << e.what();
  }
}

TEST_F(CollectiveState, AnEntryLeftOutOfSnapshotsIsTakenAndNamedOnAResumeFromOne) {
  const std::string said = "memory snapshots keep no c state: c starts afresh";
  // Snapshots after every step, checkpoint files after step 2 only; a crash after step 3.
  const std::vector<Collective> first = train(5, Resume::no, 1, said, 3);
  for (const Collective& c : first) EXPECT_EQ(c.saves, 1) << "rank " << c.rank << ": the file's save only";
  const std::vector<Collective> resumed = train(5, Resume::automatic, 1, said);
  EXPECT_NE(note.find("from memory"), std::string::npos) << note;
  EXPECT_NE(note.find("(" + said + ")"), std::string::npos) << note;
  for (const Collective& c : resumed) EXPECT_EQ(c.loaded, -1) << "rank " << c.rank << ": left as it was";
}

}  // namespace
}  // namespace tutti::train::testing
