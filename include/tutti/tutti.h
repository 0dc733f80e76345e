// tutti: data-parallel training in C++/CUDA. The one header a training program includes.
//
// Layers, bottom to top (docs/architecture.md): core (dtypes, devices, tensors, streams,
// errors), kernels, comm (bootstrap and communicators), nn, optim, amp, ddp.
#pragma once

#include "tutti/comm/communicator.h"
#include "tutti/comm/job.h"
#include "tutti/core/device.h"
#include "tutti/core/dtype.h"
#include "tutti/core/error.h"
#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels.h"
#include "tutti/ddp/ddp.h"
#include "tutti/version.h"
#include "tutti/data/dataset.h"
#include "tutti/data/idx.h"
#include "tutti/data/loader.h"
#include "tutti/io/checkpoint.h"
#include "tutti/nn/init.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/module.h"
#include "tutti/nn/parameter.h"
#include "tutti/nn/sequential.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/clip.h"
#include "tutti/optim/lr_schedule.h"
#include "tutti/optim/optimizer.h"
#include "tutti/optim/sgd.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/amp/policy.h"
