// The CPU convolution on oneDNN (Debian's libdnnl-dev, its C++ API). Built where oneDNN was
// found (TUTTI_WITH_ONEDNN); kernels/cpu/conv_onednn_none.cc otherwise.
//
// Layouts: tutti's tensors are plain NCHW / OIHW, but the primitives are asked for their own
// layouts (format_tag::any: the channel-blocked nChw16c / OIhw16i16o on AVX-512), with reorders
// in and out around them. Measured on the CNN's layers (batch 64, one thread, AVX-512, reorders
// included): 2.2-2.6x faster forward and backward than the plain layouts, where oneDNN has only
// its im2col + GEMM ("gemm:jit", no faster than tutti's own). The exception: backward data of a
// layer with few input channels (1 -> 16: 2.8x slower blocked), which keeps the plain layouts.
//
// Threads: Debian builds oneDNN on OpenMP, which runs a primitive on omp_get_max_threads() of
// the calling thread: each call sets that to kernels::cpu_threads() (the GEMMs' count) first.
#include "kernels/cpu/conv_onednn.h"

#include <dnnl_debug.h>
#include <omp.h>
#include <dnnl.hpp>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>

#include "tutti/core/error.h"
#include "tutti/kernels/threads.h"

namespace tutti::kernels::cpu::onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

std::atomic<std::int64_t> g_created{0};

// Backward data keeps the plain layouts below this many input channels (see the top).
constexpr std::int64_t kBlockedBackwardDataMinChannels = 8;
// Shapes kept per thread; past it the cache starts over (a shape change every step would be a
// program's bug, not a pattern to serve).
constexpr std::size_t kMaxCachedShapes = 64;

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

template <typename P, typename... Args>
P make(Args&&... args) {
  g_created.fetch_add(1, std::memory_order_relaxed);
  return P(std::forward<Args>(args)...);
}

struct Key {
  std::int64_t n, c, h, w, k, r, s;
  int stride, pad, threads;
  bool bias, dx;  // forward: bias; backward: db, dx
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = 0;
    for (std::int64_t v : {k.n, k.c, k.h, k.w, k.k, k.r, k.s, std::int64_t{k.stride}, std::int64_t{k.pad},
                           std::int64_t{k.threads}, std::int64_t{k.bias}, std::int64_t{k.dx}}) {
      h = h * 1000003u ^ std::hash<std::int64_t>{}(v);
    }
    return h;
  }
};

Key key_of(const Tensor& x, const Tensor& w, const Conv2dParams& p, int threads, bool bias, bool dx) {
  return {x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0), w.dim(2), w.dim(3), p.stride, p.padding, threads, bias, dx};
}

struct Dims {
  memory::dims src, wei, bias, dst, strides, pad;
};
Dims dims_of(const Key& k) {
  const std::int64_t p = (k.h + 2 * k.pad - k.r) / k.stride + 1, q = (k.w + 2 * k.pad - k.s) / k.stride + 1;
  return {{k.n, k.c, k.h, k.w}, {k.k, k.c, k.r, k.s}, {k.k}, {k.n, k.k, p, q}, {k.stride, k.stride}, {k.pad, k.pad}};
}
memory::desc md(const memory::dims& d, Tag tag) { return memory::desc(d, memory::data_type::f32, tag); }

// One tensor as a primitive takes it: `user` over the tensor's plain memory (its data handle set
// on each call), `inner` in the primitive's layout (`user` itself when that is plain), and the
// reorder between them where they differ.
struct Operand {
  memory user, inner;
  std::optional<dnnl::reorder> reorder;

  Operand() = default;
  Operand(const memory::desc& plain, const memory::desc& wanted, bool is_input) {
    user = memory(plain, engine(), DNNL_MEMORY_NONE);
    if (wanted == plain) {
      inner = user;
    } else {
      inner = memory(wanted, engine());
      reorder = is_input ? make<dnnl::reorder>(user, inner) : make<dnnl::reorder>(inner, user);
    }
  }
  // An input: bind the tensor's data and bring it into the primitive's layout.
  void load(dnnl::stream& s, const void* data) {
    user.set_data_handle(const_cast<void*>(data));
    if (reorder) reorder->execute(s, user, inner);
  }
  // An output: bind before the primitive runs, store() after it.
  void bind(void* data) { user.set_data_handle(data); }
  void store(dnnl::stream& s) {
    if (reorder) reorder->execute(s, inner, user);
  }
};

struct Forward {
  dnnl::convolution_forward prim;
  Operand x, w, y;
  memory bias;
};

struct Backward {
  std::optional<dnnl::convolution_backward_data> data;
  Operand data_dy, data_w, dx;
  dnnl::convolution_backward_weights weights;
  Operand weights_x, weights_dy;
  memory dw_inner, dw_user, db;
  dnnl::reorder dw_copy, dw_add;  // dw_inner -> dw: overwrite, or add onto it
};

dnnl::convolution_forward::primitive_desc forward_pd(const Dims& d, Tag x_tag, Tag w_tag, bool bias) {
  using F = dnnl::convolution_forward;
  const auto kind = dnnl::prop_kind::forward_training;
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto x = md(d.src, x_tag), w = md(d.wei, w_tag), y = md(d.dst, x_tag);
  const F::desc desc = bias ? F::desc(kind, algo, x, w, md(d.bias, Tag::x), y, d.strides, d.pad, d.pad)
                            : F::desc(kind, algo, x, w, y, d.strides, d.pad, d.pad);
  return F::primitive_desc(desc, engine());
}

std::unique_ptr<Forward> make_forward(const Key& k) {
  const Dims d = dims_of(k);
  const auto pd = forward_pd(d, Tag::any, Tag::any, k.bias);
  auto f = std::make_unique<Forward>();
  f->prim = make<dnnl::convolution_forward>(pd);
  f->x = Operand(md(d.src, Tag::nchw), pd.src_desc(), true);
  f->w = Operand(md(d.wei, Tag::oihw), pd.weights_desc(), true);
  f->y = Operand(md(d.dst, Tag::nchw), pd.dst_desc(), false);
  if (k.bias) f->bias = memory(md(d.bias, Tag::x), engine(), DNNL_MEMORY_NONE);
  return f;
}

std::unique_ptr<Backward> make_backward(const Key& k) {
  const Dims d = dims_of(k);
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto x_plain = md(d.src, Tag::nchw), w_plain = md(d.wei, Tag::oihw), y_plain = md(d.dst, Tag::nchw);
  auto b = std::make_unique<Backward>();
  if (k.dx) {
    using D = dnnl::convolution_backward_data;
    const Tag x_tag = k.c >= kBlockedBackwardDataMinChannels ? Tag::any : Tag::nchw;
    const Tag w_tag = k.c >= kBlockedBackwardDataMinChannels ? Tag::any : Tag::oihw;
    const auto hint = forward_pd(d, x_tag, w_tag, false);
    const D::desc desc(algo, md(d.src, x_tag), md(d.wei, w_tag), md(d.dst, x_tag), d.strides, d.pad, d.pad);
    const D::primitive_desc pd(desc, engine(), hint);
    b->data = make<D>(pd);
    b->data_dy = Operand(y_plain, pd.diff_dst_desc(), true);
    b->data_w = Operand(w_plain, pd.weights_desc(), true);
    b->dx = Operand(x_plain, pd.diff_src_desc(), false);
  }
  using W = dnnl::convolution_backward_weights;
  const auto hint = forward_pd(d, Tag::any, Tag::any, k.bias);
  const auto x = md(d.src, Tag::any), w = md(d.wei, Tag::any), y = md(d.dst, Tag::any);
  const W::desc desc = k.bias ? W::desc(algo, x, w, md(d.bias, Tag::x), y, d.strides, d.pad, d.pad)
                              : W::desc(algo, x, w, y, d.strides, d.pad, d.pad);
  const W::primitive_desc pd(desc, engine(), hint);
  b->weights = make<W>(pd);
  b->weights_x = Operand(x_plain, pd.src_desc(), true);
  b->weights_dy = Operand(y_plain, pd.diff_dst_desc(), true);
  b->dw_inner = memory(pd.diff_weights_desc(), engine());
  b->dw_user = memory(w_plain, engine(), DNNL_MEMORY_NONE);
  b->dw_copy = make<dnnl::reorder>(b->dw_inner, b->dw_user);
  dnnl::post_ops add;
  add.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(add);
  b->dw_add = make<dnnl::reorder>(b->dw_inner, b->dw_user, attr);
  if (k.bias) b->db = memory(md(d.bias, Tag::x), engine());
  return b;
}

// This thread's primitives and stream.
struct Cache {
  dnnl::stream stream{engine()};
  std::unordered_map<Key, std::unique_ptr<Forward>, KeyHash> forward;
  std::unordered_map<Key, std::unique_ptr<Backward>, KeyHash> backward;

  template <typename T, typename Make>
  T& get(std::unordered_map<Key, std::unique_ptr<T>, KeyHash>& map, const Key& k, Make make_entry) {
    auto it = map.find(k);
    if (it != map.end()) return *it->second;
    if (map.size() >= kMaxCachedShapes) map.clear();
    return *map.emplace(k, make_entry(k)).first->second;
  }
};
Cache& cache() {
  thread_local Cache c;
  return c;
}

// The GEMMs' thread count, made OpenMP's for this thread (oneDNN runs on OpenMP).
int use_gemm_threads() {
  const int threads = cpu_threads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  return threads;
}

}  // namespace

bool available() { return true; }

std::string describe() {
  const dnnl_version_t* v = dnnl_version();
  const std::string runtime = v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : dnnl_runtime2str(v->cpu_runtime);
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " (" +
         dnnl_cpu_isa2str(static_cast<dnnl_cpu_isa_t>(dnnl::get_effective_cpu_isa())) + ", " + runtime + ")";
}

std::int64_t primitives_created() { return g_created.load(std::memory_order_relaxed); }

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params) {
  try {
    const int threads = use_gemm_threads();
    Cache& c = cache();
    Forward& f = c.get(c.forward, key_of(x, w, params, threads, bias.defined(), false), make_forward);
    f.x.load(c.stream, x.data());
    f.w.load(c.stream, w.data());
    f.y.bind(y.data());
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, f.x.inner}, {DNNL_ARG_WEIGHTS, f.w.inner}, {DNNL_ARG_DST, f.y.inner}};
    if (bias.defined()) {
      f.bias.set_data_handle(bias.data());
      args.emplace(DNNL_ARG_BIAS, f.bias);
    }
    f.prim.execute(c.stream, args);
    f.y.store(c.stream);
    c.stream.wait();
  } catch (const dnnl::error& e) {
    TUTTI_THROW(Error, "conv2d_forward: oneDNN failed on x ", x.str(), " w ", w.str(), ": ", e.what());
  }
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params) {
  try {
    const int threads = use_gemm_threads();
    Cache& c = cache();
    Backward& b = c.get(c.backward, key_of(x, w, params, threads, db.defined(), dx.defined()), make_backward);
    if (b.data) {
      b.data_dy.load(c.stream, dy.data());
      b.data_w.load(c.stream, w.data());
      b.dx.bind(dx.data());
      b.data->execute(
          c.stream,
          {{DNNL_ARG_DIFF_DST, b.data_dy.inner}, {DNNL_ARG_WEIGHTS, b.data_w.inner}, {DNNL_ARG_DIFF_SRC, b.dx.inner}});
      b.dx.store(c.stream);
    }
    b.weights_x.load(c.stream, x.data());
    // dy once when both primitives take it in the same layout.
    memory dy_w = b.weights_dy.inner;
    if (b.data && b.data_dy.inner.get_desc() == b.weights_dy.inner.get_desc()) {
      dy_w = b.data_dy.inner;
    } else {
      b.weights_dy.load(c.stream, dy.data());
    }
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, b.weights_x.inner}, {DNNL_ARG_DIFF_DST, dy_w}, {DNNL_ARG_DIFF_WEIGHTS, b.dw_inner}};
    if (db.defined()) args.emplace(DNNL_ARG_DIFF_BIAS, b.db);
    b.weights.execute(c.stream, args);
    b.dw_user.set_data_handle(dw.data());
    (accumulate_params ? b.dw_add : b.dw_copy).execute(c.stream, b.dw_inner, b.dw_user);
    c.stream.wait();
    if (db.defined()) {
      const float* src = static_cast<const float*>(b.db.get_data_handle());
      float* out = db.data_as<float>();
      for (std::int64_t k = 0; k < db.numel(); ++k) out[k] = accumulate_params ? out[k] + src[k] : src[k];
    }
  } catch (const dnnl::error& e) {
    TUTTI_THROW(Error, "conv2d_backward: oneDNN failed on x ", x.str(), " w ", w.str(), ": ", e.what());
  }
}

}  // namespace tutti::kernels::cpu::onednn
