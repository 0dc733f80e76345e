// The hazard detector's reports: the .cu line of an access, from the return address of the
// instruction that called a ThreadSanitizer hook (racecheck.cc), found with addr2line.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "racecheck.h"
#include "runtime.h"

namespace tutti::emu::racecheck {

// "kernels/cuda/x.cu:77" for the instruction that called a hook (found at report time only).
std::string source_line(const void* return_address) {
  if (return_address == nullptr) return "(a line not recorded)";
  static auto& m = *new std::mutex;
  static auto& cache = *new std::map<const void*, std::string>;
  std::lock_guard l(m);
  if (auto it = cache.find(return_address); it != cache.end()) return it->second;
  const auto pc = reinterpret_cast<std::uintptr_t>(return_address) - 1;  // inside the call
  char fallback[64];
  std::snprintf(fallback, sizeof fallback, "pc %#zx", static_cast<std::size_t>(pc));
  std::string result = fallback;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(pc), &info) != 0 && info.dli_fname != nullptr && info.dli_fbase != nullptr) {
    // Shared objects and position-independent executables are looked up by offset.
    const auto* header = static_cast<const ElfW(Ehdr)*>(info.dli_fbase);
    const std::uintptr_t address = header->e_type == ET_EXEC ? pc : pc - reinterpret_cast<std::uintptr_t>(header);
    std::string object = info.dli_fname;
    if (object.empty() || object.find('\'') != std::string::npos) object = "/proc/self/exe";
    char command[4200];
    // -i: the chain of inlined calls, innermost first; the access's line is the innermost one
    // in a .cu or .cuh file (an atomic's own access is inside libstdc++'s std::atomic_ref).
    std::snprintf(command, sizeof command, "addr2line -i -e '%s' %#zx 2>/dev/null", object.c_str(),
                  static_cast<std::size_t>(address));
    if (std::FILE* p = popen(command, "r")) {
      char line[4096] = {};
      std::string first, in_cuda;
      while (std::fgets(line, sizeof line, p) != nullptr) {
        std::string found = line;
        found = found.substr(0, found.find_first_of(" \n"));  // drop " (discriminator N)"
        if (found.rfind("??", 0) == 0) continue;
        if (first.empty()) first = found;
        const auto colon = found.rfind(':');
        const std::string file = found.substr(0, colon);
        if (in_cuda.empty() && (file.ends_with(".cu") || file.ends_with(".cuh"))) in_cuda = found;
      }
      pclose(p);
      if (!in_cuda.empty()) {
        result = short_path(in_cuda);
      } else if (!first.empty()) {
        result = short_path(first);
      }
    }
  }
  cache.emplace(return_address, result);
  return result;
}

}  // namespace tutti::emu::racecheck
