// The build without oneDNN (TUTTI_WITH_ONEDNN off): every convolution runs on im2col + OpenBLAS
// (kernels/cpu/conv.cc), which never calls the functions below that throw.
#include "kernels/cpu/conv_onednn.h"

#include "tutti/core/error.h"

namespace tutti::kernels::cpu::onednn {

bool available() { return false; }
std::string describe() { return ""; }
std::int64_t primitives_created() { return 0; }

void conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) {
  TUTTI_THROW(Error, "conv2d_forward: tutti was built without oneDNN (TUTTI_WITH_ONEDNN=OFF)");
}
void conv2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                     const Conv2dParams&) {
  TUTTI_THROW(Error, "conv2d_backward: tutti was built without oneDNN (TUTTI_WITH_ONEDNN=OFF)");
}

}  // namespace tutti::kernels::cpu::onednn
