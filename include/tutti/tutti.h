// tutti: data-parallel training in C++/CUDA. The one header a training program includes.
//
// Layers, bottom to top (docs/architecture.md): core (dtypes, devices, tensors, streams,
// errors), kernels, comm (bootstrap and communicators), nn, optim, amp, ddp.
#pragma once

#include "tutti/core/device.h"
#include "tutti/core/dtype.h"
#include "tutti/core/error.h"
#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels.h"
#include "tutti/version.h"
