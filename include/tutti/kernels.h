// All of tutti's kernels: forward and backward of every layer, reductions, casts and
// optimizer updates, each on the CPU and on CUDA behind one function chosen by the
// tensors' device.
#pragma once

#include "tutti/kernels/attention.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/compress.h"
#include "tutti/kernels/conv.h"
#include "tutti/kernels/cross_entropy.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/embedding.h"
#include "tutti/kernels/fixed_point.h"
#include "tutti/kernels/flash_attention.h"
#include "tutti/kernels/layernorm.h"
#include "tutti/kernels/linear.h"
#include "tutti/kernels/optimizer.h"
#include "tutti/kernels/reduce.h"
#include "tutti/kernels/rmsnorm.h"
#include "tutti/kernels/rope.h"
#include "tutti/kernels/threads.h"
