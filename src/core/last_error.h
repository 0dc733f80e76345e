// The last tutti::Error made in this process, for the Job's unwinding destructor: it cannot see
// the exception that unwinds through it, but it can tell the other ranks what most likely
// caused it. Internal header.
#pragma once

#include <optional>
#include <string>

namespace tutti::detail {
// what() of the last tutti::Error constructed in this process (any thread), if it was made
// within the last max_age_s seconds.
std::optional<std::string> recent_error(double max_age_s);
}  // namespace tutti::detail
