// See fiber_switch.h.
#include "fiber_switch.h"

#if defined(__x86_64__) && defined(__linux__)

// The frame is make_fcontext's: 0x38 bytes below the return address, r12-r15, rbx and rbp at
// 0x8-0x30 (0x0-0x7 held the control words that this jump does not touch). A fresh context's
// frame holds Boost's trampoline as return address and the entry function in rbx; the
// trampoline calls it with the transfer_t in rdi (the context jumped from) and rsi (the data).
extern "C" tutti::emu::transfer_t tutti_emu_jump(tutti::emu::fcontext_t to, void* data);

asm(R"(
    .text
    .globl  tutti_emu_jump
    .hidden tutti_emu_jump
    .type   tutti_emu_jump, @function
    .align  16
tutti_emu_jump:
    leaq    -0x38(%rsp), %rsp
    movq    %r12, 0x8(%rsp)
    movq    %r13, 0x10(%rsp)
    movq    %r14, 0x18(%rsp)
    movq    %r15, 0x20(%rsp)
    movq    %rbx, 0x28(%rsp)
    movq    %rbp, 0x30(%rsp)
    movq    %rsp, %rax
    movq    %rdi, %rsp
    movq    0x38(%rsp), %r8
    movq    0x8(%rsp), %r12
    movq    0x10(%rsp), %r13
    movq    0x18(%rsp), %r14
    movq    0x20(%rsp), %r15
    movq    0x28(%rsp), %rbx
    movq    0x30(%rsp), %rbp
    leaq    0x40(%rsp), %rsp
    movq    %rsi, %rdx
    movq    %rax, %rdi
    jmp     *%r8
    .size   tutti_emu_jump, .-tutti_emu_jump
)");

namespace tutti::emu {
transfer_t jump_to(fcontext_t to, void* data) { return tutti_emu_jump(to, data); }
}  // namespace tutti::emu

#else

namespace tutti::emu {
transfer_t jump_to(fcontext_t to, void* data) { return boost::context::detail::jump_fcontext(to, data); }
}  // namespace tutti::emu

#endif
