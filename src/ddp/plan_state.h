// A flat f32 vector in a plan's layout <-> its entries by parameter name (whole tensors, the
// layout of the checkpoints): DistributedDataParallel's model state under half masters and
// DiLoCo's outer state (global parameters, momentum) read and write it here.
#pragma once

#include <string>
#include <string_view>

#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/flat_plan.h"

namespace tutti::ddp {

// Every entry of `plan` by name: a CPU copy of its view of `flat` (f32 [plan.total], on any
// device), enqueued on `stream`; the caller synchronizes before using them or letting `flat` go.
StateDict named_of_flat(const nn::FlatPlan& plan, const Tensor& flat, const Stream& stream);

// Every entry of `plan` by name as a view of `flat` (f32 [plan.total]), no copy: for a flat
// vector made for the caller (a gather), whose storage the views then keep. On the CPU this is
// what named_of_flat would copy, without holding the state twice.
StateDict named_views_of_flat(const nn::FlatPlan& plan, const Tensor& flat);

// A CPU f32 [plan.total] (zero in the padding) holding the entries prefix + name of `state`.
// Every entry is checked before its copy: InvalidArgument "<call>: no entry for parameter
// '<prefix><name>'<missing_hint>" or "<call>: '<prefix><name>' is <tensor> but the parameter is
// <shape> f32". Entries of `state` that the plan does not name are not looked at.
Tensor flat_of_named(const nn::FlatPlan& plan, const StateDict& state, const std::string& prefix, std::string_view call,
                     std::string_view missing_hint = "");

}  // namespace tutti::ddp
