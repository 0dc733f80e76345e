// CPU threads of the CPU kernels: the OpenBLAS GEMMs of Linear and Conv2d use this many
// threads; the other CPU kernels run on the calling thread. Process-wide.
//
// tutti::Job sets it when the job starts (JobOptions::cpu_threads): with several ranks on one
// host, each rank's GEMMs should use its share of the cores, not all of them.
#pragma once

namespace tutti::kernels {

// threads >= 1; throws InvalidArgument otherwise.
void set_cpu_threads(int threads);
int cpu_threads();

}  // namespace tutti::kernels
