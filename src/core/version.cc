#include "tutti/version.h"

#define TUTTI_STRINGIFY_(x) #x
#define TUTTI_STRINGIFY(x) TUTTI_STRINGIFY_(x)

namespace tutti {
// Spelled from the macros, so that it cannot drift from the headers it was built with.
const char* version() {
  return TUTTI_STRINGIFY(TUTTI_VERSION_MAJOR) "." TUTTI_STRINGIFY(TUTTI_VERSION_MINOR) "." TUTTI_STRINGIFY(
      TUTTI_VERSION_PATCH);
}
}  // namespace tutti
