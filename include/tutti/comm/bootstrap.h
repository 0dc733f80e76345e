// Bootstrap: how ranks exchange a few bytes before (and besides) their communicators: the
// role of c10d's Store and gloo's rendezvous. The Job's start-up checks, check_same, summary
// and the NCCL unique id go through it.
//
// Implementations: MPI (what a Job uses, over its duplicate of MPI_COMM_WORLD) and the
// in-process ranks of tutti::ThreadGroup (thread_group.h), whose ranks are threads.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tutti {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // COLLECTIVE, blocks: every rank's bytes, in rank order (the same vector on every rank).
  virtual std::vector<std::string> allgather(std::string_view mine) = 0;
  // COLLECTIVE, blocks until every rank has called it.
  virtual void barrier() = 0;
  // COLLECTIVE, blocks: `bytes` of rank `root` on every rank (other ranks' bytes are ignored).
  // By default an allgather.
  virtual std::string broadcast(std::string_view bytes, int root);
};

}  // namespace tutti
