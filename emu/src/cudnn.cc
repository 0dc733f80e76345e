// cuDNN on the emulated device: the convolutions tutti uses, as direct loops in fp32 on the
// stream's host thread. Slow and simple on purpose: it is the reference the CUDA launcher's
// plumbing (descriptors, algorithm choice, aligned scratch, the f32 gradient add, the bias
// kernel) runs against, not a fast path.
#include <array>
#include <memory>
#include <vector>

#include "cudnn.h"
#include "elements.h"
#include "runtime.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::array<int, 4> dims{};  // n, c, h, w
  bool set = false;
};
struct cudnnFilterStruct {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::array<int, 4> dims{};  // k, c, r, s
  bool set = false;
};
struct cudnnConvolutionStruct {
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
  bool set = false;
};

namespace tutti::emu {
namespace {

Element element(cudnnDataType_t t) {
  return t == CUDNN_DATA_HALF ? Element::f16 : t == CUDNN_DATA_BFLOAT16 ? Element::bf16 : Element::f32;
}

bool supported(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16; }

// out = alpha · acc + beta · out, one rounding; out is not read when beta == 0.
void blend(void* out, Element t, const std::vector<float>& acc, float alpha, float beta) {
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const float v = alpha * acc[i];
    store(out, t, i, beta == 0.0f ? v : v + beta * load(out, t, i));
  }
}

// The geometry of one convolution, checked against the descriptors.
struct Conv {
  int n, c, h, w, k, r, s, p, q, pad_h, pad_w, stride_h, stride_w;
  Element type;

  std::size_t x_at(int in, int ic, int ih, int iw) const {
    return ((static_cast<std::size_t>(in) * c + ic) * h + ih) * w + iw;
  }
  std::size_t w_at(int ik, int ic, int ir, int is) const {
    return ((static_cast<std::size_t>(ik) * c + ic) * r + ir) * s + is;
  }
  std::size_t y_at(int in, int ik, int ip, int iq) const {
    return ((static_cast<std::size_t>(in) * k + ik) * p + ip) * q + iq;
  }
  std::size_t x_count() const { return static_cast<std::size_t>(n) * c * h * w; }
  std::size_t w_count() const { return static_cast<std::size_t>(k) * c * r * s; }
  std::size_t y_count() const { return static_cast<std::size_t>(n) * k * p * q; }
  // Calls f(x index, w index, y index) for every product term of the convolution.
  template <typename F>
  void for_each_term(F f) const {
    for (int in = 0; in < n; ++in)
      for (int ik = 0; ik < k; ++ik)
        for (int ip = 0; ip < p; ++ip)
          for (int iq = 0; iq < q; ++iq)
            for (int ic = 0; ic < c; ++ic)
              for (int ir = 0; ir < r; ++ir) {
                const int ih = ip * stride_h - pad_h + ir;
                if (ih < 0 || ih >= h) continue;
                for (int is = 0; is < s; ++is) {
                  const int iw = iq * stride_w - pad_w + is;
                  if (iw < 0 || iw >= w) continue;
                  f(x_at(in, ic, ih, iw), w_at(ik, ic, ir, is), y_at(in, ik, ip, iq));
                }
              }
  }
};

bool make_conv(const cudnnTensorStruct* x, const cudnnFilterStruct* wd, const cudnnConvolutionStruct* conv,
               const cudnnTensorStruct* y, Conv& out) {
  if (x == nullptr || wd == nullptr || conv == nullptr || y == nullptr) return false;
  if (!x->set || !wd->set || !conv->set || !y->set) return false;
  if (x->type != wd->type || x->type != y->type) return false;
  const auto [n, c, h, w] = x->dims;
  const auto [k, fc, r, s] = wd->dims;
  if (fc != c || y->dims[0] != n || y->dims[1] != k) return false;
  const int p = (h + 2 * conv->pad_h - r) / conv->stride_h + 1;
  const int q = (w + 2 * conv->pad_w - s) / conv->stride_w + 1;
  if (y->dims[2] != p || y->dims[3] != q) return false;
  out = Conv{n, c, h, w, k, r, s, p, q, conv->pad_h, conv->pad_w, conv->stride_h, conv->stride_w, element(x->type)};
  return true;
}

cudnnStatus_t queue(cudnnHandle_t handle, std::function<void()> work) {
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (sticky_error() != cudaSuccess) return CUDNN_STATUS_EXECUTION_FAILED;
  auto s = stream_of(handle->stream);
  if (!s) return CUDNN_STATUS_BAD_PARAM;
  enqueue(s, std::move(work));
  return CUDNN_STATUS_SUCCESS;
}

template <typename Perf, typename Algo>
cudnnStatus_t one_algorithm(bool ok, int requested, int* returned, Perf* perf, Algo algo) {
  *returned = 0;
  if (!ok) return CUDNN_STATUS_BAD_PARAM;
  if (requested < 1) return CUDNN_STATUS_BAD_PARAM;
  perf[0] = Perf{};
  perf[0].algo = algo;
  perf[0].status = CUDNN_STATUS_SUCCESS;
  perf[0].determinism = CUDNN_DETERMINISTIC;
  *returned = 1;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace
}  // namespace tutti::emu

using namespace tutti::emu;

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

std::size_t cudnnGetVersion() { return CUDNN_VERSION; }

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  notice_once("cuDNN convolutions run as a CPU reference (direct loops in fp32), not as GPU code");
  *handle = new cudnnContext{};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  *desc = new cudnnTensorStruct{};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format, cudnnDataType_t type,
                                         int n, int c, int h, int w) {
  if (desc == nullptr || format != CUDNN_TENSOR_NCHW || !supported(type) || n <= 0 || c <= 0 || h <= 0 || w <= 0) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  *desc = cudnnTensorStruct{type, {n, c, h, w}, true};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  *desc = new cudnnFilterStruct{};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
  if (desc == nullptr || format != CUDNN_TENSOR_NCHW || !supported(type) || k <= 0 || c <= 0 || h <= 0 || w <= 0) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  *desc = cudnnFilterStruct{type, {k, c, h, w}, true};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  *desc = new cudnnConvolutionStruct{};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w, int stride_h,
                                              int stride_w, int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type) {
  if (desc == nullptr || pad_h < 0 || pad_w < 0 || stride_h < 1 || stride_w < 1) return CUDNN_STATUS_BAD_PARAM;
  // What the emulation computes: unit dilation, cross-correlation, fp32 accumulation.
  if (dilation_h != 1 || dilation_w != 1 || mode != CUDNN_CROSS_CORRELATION || compute_type != CUDNN_DATA_FLOAT) {
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  *desc = cudnnConvolutionStruct{pad_h, pad_w, stride_h, stride_w, true};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t) {
  return desc == nullptr ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t conv,
                                                     cudnnTensorDescriptor_t y, int requested, int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf) {
  Conv g;
  return one_algorithm(handle != nullptr && make_conv(x, w, conv, y, g), requested, returned, perf,
                       CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, cudnnFilterDescriptor_t w,
                                                          cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t conv,
                                                          cudnnTensorDescriptor_t dx, int requested, int* returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  Conv g;
  return one_algorithm(handle != nullptr && make_conv(dx, w, conv, dy, g), requested, returned, perf,
                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_0);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                                                            cudnnTensorDescriptor_t dy,
                                                            cudnnConvolutionDescriptor_t conv,
                                                            cudnnFilterDescriptor_t dw, int requested, int* returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  Conv g;
  return one_algorithm(handle != nullptr && make_conv(x, dw, conv, dy, g), requested, returned, perf,
                       CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0);
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t, cudnnFilterDescriptor_t,
                                                      cudnnConvolutionDescriptor_t, cudnnTensorDescriptor_t,
                                                      cudnnConvolutionFwdAlgo_t, std::size_t* bytes) {
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, cudnnFilterDescriptor_t,
                                                           cudnnTensorDescriptor_t, cudnnConvolutionDescriptor_t,
                                                           cudnnTensorDescriptor_t, cudnnConvolutionBwdDataAlgo_t,
                                                           std::size_t* bytes) {
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t,
                                                             cudnnTensorDescriptor_t, cudnnConvolutionDescriptor_t,
                                                             cudnnFilterDescriptor_t, cudnnConvolutionBwdFilterAlgo_t,
                                                             std::size_t* bytes) {
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, cudnnTensorDescriptor_t x_desc,
                                      const void* x, cudnnFilterDescriptor_t w_desc, const void* w,
                                      cudnnConvolutionDescriptor_t conv, cudnnConvolutionFwdAlgo_t, void*, std::size_t,
                                      const void* beta, cudnnTensorDescriptor_t y_desc, void* y) {
  Conv g;
  if (!make_conv(x_desc, w_desc, conv, y_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  return queue(handle, [=] {
    const std::vector<float> xf = loads(x, g.type, g.x_count()), wf = loads(w, g.type, g.w_count());
    std::vector<float> acc(g.y_count(), 0.0f);
    g.for_each_term([&](std::size_t xi, std::size_t wi, std::size_t yi) { acc[yi] += xf[xi] * wf[wi]; });
    blend(y, g.type, acc, a, b);
  });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, cudnnFilterDescriptor_t w_desc,
                                           const void* w, cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           cudnnConvolutionDescriptor_t conv, cudnnConvolutionBwdDataAlgo_t, void*,
                                           std::size_t, const void* beta, cudnnTensorDescriptor_t dx_desc, void* dx) {
  Conv g;
  if (!make_conv(dx_desc, w_desc, conv, dy_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  return queue(handle, [=] {
    const std::vector<float> dyf = loads(dy, g.type, g.y_count()), wf = loads(w, g.type, g.w_count());
    std::vector<float> acc(g.x_count(), 0.0f);
    g.for_each_term([&](std::size_t xi, std::size_t wi, std::size_t yi) { acc[xi] += dyf[yi] * wf[wi]; });
    blend(dx, g.type, acc, a, b);
  });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha, cudnnTensorDescriptor_t x_desc,
                                             const void* x, cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             cudnnConvolutionDescriptor_t conv, cudnnConvolutionBwdFilterAlgo_t, void*,
                                             std::size_t, const void* beta, cudnnFilterDescriptor_t dw_desc, void* dw) {
  Conv g;
  if (!make_conv(x_desc, dw_desc, conv, dy_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  return queue(handle, [=] {
    const std::vector<float> xf = loads(x, g.type, g.x_count()), dyf = loads(dy, g.type, g.y_count());
    std::vector<float> acc(g.w_count(), 0.0f);
    g.for_each_term([&](std::size_t xi, std::size_t wi, std::size_t yi) { acc[wi] += xf[xi] * dyf[yi]; });
    blend(dw, g.type, acc, a, b);
  });
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void* alpha, cudnnTensorDescriptor_t a_desc, const void* a,
                             const void* beta, cudnnTensorDescriptor_t c_desc, void* c) {
  if (a_desc == nullptr || c_desc == nullptr || !a_desc->set || !c_desc->set || a_desc->type != c_desc->type) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const auto ad = a_desc->dims, cd = c_desc->dims;
  for (int i = 0; i < 4; ++i) {
    if (ad[static_cast<std::size_t>(i)] != 1 && ad[static_cast<std::size_t>(i)] != cd[static_cast<std::size_t>(i)]) {
      return CUDNN_STATUS_BAD_PARAM;
    }
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const Element t = element(c_desc->type);
  return queue(handle, [=] {
    std::size_t i = 0;
    for (int n = 0; n < cd[0]; ++n)
      for (int ch = 0; ch < cd[1]; ++ch)
        for (int h = 0; h < cd[2]; ++h)
          for (int w = 0; w < cd[3]; ++w, ++i) {
            const std::size_t ai =
                ((static_cast<std::size_t>(ad[0] == 1 ? 0 : n) * ad[1] + (ad[1] == 1 ? 0 : ch)) * ad[2] +
                 (ad[2] == 1 ? 0 : h)) *
                    ad[3] +
                (ad[3] == 1 ? 0 : w);
            const float v = al * load(a, t, ai);
            store(c, t, i, be == 0.0f ? v : v + be * load(c, t, i));
          }
  });
}
