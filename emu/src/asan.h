// TUTTI_EMU_ASAN: 1 when the emulator is built with AddressSanitizer, whose fiber and poisoning
// interfaces it then calls (the stacks of fibers, the shared-memory arena); else 0.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TUTTI_EMU_ASAN 1
#else
#define TUTTI_EMU_ASAN 0
#endif
