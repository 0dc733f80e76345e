#include "tutti/nn/parameter.h"

#include <cstddef>

#include "tutti/core/error.h"

namespace tutti::nn {
namespace {

thread_local int deferred_scopes = 0;

}  // namespace

Parameter::Parameter(Shape shape, InitSpec init_spec)
    : value(deferred_scopes > 0 ? Tensor() : Tensor::zeros(shape, DType::f32)),
      init(init_spec),
      deferred(deferred_scopes > 0),
      shape_(std::move(shape)),
      numel_(numel_of(shape_)) {}

DeferredParameters::DeferredParameters() { ++deferred_scopes; }
DeferredParameters::~DeferredParameters() { --deferred_scopes; }
bool DeferredParameters::active() { return deferred_scopes > 0; }

void fill_from_source(const Parameter& p, Tensor& dst, const Stream& stream) {
  TUTTI_CHECK_ARG(static_cast<bool>(p.source), "parameter ", p.name,
                  " is deferred (made under nn::DeferredParameters) and was never initialized: call init(seed) or a "
                  "loader (models::hf::load_weights) on the model before it is materialized");
  Tensor host = Tensor::empty(p.shape(), DType::f32);
  p.source(host);
  dst.copy_from(host, stream);
  stream.synchronize();  // `host` is freed next
}

std::vector<Tensor> coalesce_views(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  // The current run: a byte range [begin, end) of one storage, and the first tensor of it.
  const Storage* storage = nullptr;
  DType dtype = DType::f32;
  char* begin = nullptr;
  char* end = nullptr;
  Tensor first;
  int count = 0;
  auto flush = [&] {
    if (count == 0) return;
    if (count == 1) {
      out.push_back(first);
    } else {
      // A wrapped view: it does not own the storage, the tensors it was built from do.
      const std::int64_t n = static_cast<std::int64_t>((end - begin) / static_cast<std::ptrdiff_t>(size_of(dtype)));
      out.push_back(Tensor::wrap(begin, {n}, dtype, first.device()));
    }
    count = 0;
  };
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    char* b = static_cast<char*>(t.data());
    char* e = b + t.nbytes();
    if (count > 0 && t.storage().get() == storage && t.dtype() == dtype && (b == end || e == begin)) {
      if (b == end)
        end = e;
      else
        begin = b;
      ++count;
      continue;
    }
    flush();
    storage = t.storage().get();
    dtype = t.dtype();
    begin = b;
    end = e;
    first = t;
    count = 1;
  }
  flush();
  return out;
}

}  // namespace tutti::nn
