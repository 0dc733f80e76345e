// The version of tutti these headers belong to (semantic versioning).
#pragma once

#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 2
#define TUTTI_VERSION_PATCH 0

namespace tutti {
// "0.2.0": the version of the library actually linked (may differ from the headers').
const char* version();
}  // namespace tutti
