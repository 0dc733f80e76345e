// The switch between the fibers that run the emulated device's CUDA threads (scheduler.cc).
//
// Boost.Context's contexts (make_fcontext's frame layout, transfer_t), with a jump of our own
// on x86-64 Linux. Why: Boost's jump_fcontext saves and restores the x87 and SSE control words
// (fnstcw, fldcw, stmxcsr, ldmxcsr) at every switch, in case a fiber changed its rounding mode;
// those four instructions were 78% of jump_fcontext's samples, and jump_fcontext a fifth of an
// emulated test's CPU time. Kernel code never changes the floating-point environment (CUDA has
// no such call), so tutti's jump leaves it alone. Elsewhere Boost's jump is used.
#pragma once

#include <boost/context/detail/fcontext.hpp>

namespace tutti::emu {

using boost::context::detail::fcontext_t;
using boost::context::detail::transfer_t;

// A context on the stack that ends below `top` (`size` bytes), which starts in `entry` at its
// first jump. `entry` must never return: it ends by jumping away for good.
inline fcontext_t make_context(void* top, std::size_t size, void (*entry)(transfer_t)) {
  return boost::context::detail::make_fcontext(top, size, entry);
}

// Saves the running context and resumes `to`, handing it `data`; returns when something jumps
// back here, with that context and its data.
transfer_t jump_to(fcontext_t to, void* data);

}  // namespace tutti::emu
