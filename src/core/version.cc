#include "tutti/version.h"

namespace tutti {
const char* version() { return "0.1.0"; }
}  // namespace tutti
