#include "tutti/train/summary.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tutti/core/error.h"

namespace tutti::train {
namespace {

// The rank the launcher gave this process, before the job has started (0 when alone).
bool launcher_rank_is_zero() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::strcmp(v, "0") == 0;
  }
  return true;
}

// JSON has no NaN or infinity: a non-finite loss is written as its name.
std::string loss_json(double loss) {
  if (std::isfinite(loss)) {
    char buf[32];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, loss).ptr);
  }
  return std::isnan(loss) ? "\"nan\"" : (loss > 0 ? "\"inf\"" : "\"-inf\"");
}

// The length of the valid UTF-8 sequence at s[i] (0: not valid).
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  if (n == 2 && c < 0xC2) return 0;                                      // overlong
  if (n == 3 && c == 0xE0 && b(i + 1) < 0xA0) return 0;                  // overlong
  if (n == 3 && c == 0xED && b(i + 1) >= 0xA0) return 0;                 // surrogates
  if (n == 4 && (c > 0xF4 || (c == 0xF0 && b(i + 1) < 0x90))) return 0;  // overlong, > U+10FFFF
  if (n == 4 && c == 0xF4 && b(i + 1) >= 0x90) return 0;
  return n;
}

}  // namespace

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_length(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    const char c = s[i];
    if (n > 1) {
      out.append(s.substr(i, n));
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
      out += esc;
    } else {
      out += c;
    }
    i += n;
  }
  return out + "\"";
}

Summary::Summary(std::string path) : path_(std::move(path)), writer_(launcher_rank_is_zero()) {}

void Summary::set_rank(int rank) {
  writer_ = rank == 0;
  if (!writer_ || path_.empty()) return;
  const bool existed = std::filesystem::exists(path_);
  {
    std::ofstream probe(path_, std::ios::app);
    TUTTI_CHECK_ARG(probe.good(), "--json ", path_, ": cannot write there (", std::strerror(errno), ")");
  }
  if (!existed) std::filesystem::remove(path_);
}

void Summary::set(const std::string& key, std::string_view value) { set_json(key, json_quote(value)); }

void Summary::set_json(const std::string& key, std::string json) { fields_[key] = std::move(json); }

void Summary::set_number(const std::string& key, double value) {
  set_json(key, std::isfinite(value) ? loss_json(value) : "null");
}

void Summary::set_step(std::int64_t steps, double loss) {
  steps_ = steps;
  loss_ = loss;
  if (std::isfinite(loss) && loss >= 0) {
    last_finite_step_ = steps;
    last_finite_loss_ = loss;
  }
}

void Summary::completed() { write("completed"); }

void Summary::diverged() {
  set_json("loss", loss_json(loss_));
  if (last_finite_step_ >= 0) {
    set_number("last_finite_loss", last_finite_loss_);
    set("last_finite_step", last_finite_step_);
  } else {
    set_null("last_finite_loss");
    set_null("last_finite_step");
  }
  write("diverged");
}

void Summary::stopped(const std::string& signal, const std::string& checkpoint) {
  set("signal", signal);
  if (checkpoint.empty()) {
    set_null("checkpoint");
  } else {
    set("checkpoint", checkpoint);
  }
  write("stopped");
}

void Summary::failed(const std::string& error) {
  set("error", error);
  write("failed");
}

void Summary::write(const char* status) {
  // One summary per run: an error while the summary of another ending is written keeps the first.
  if (!writer_ || path_.empty() || written_) return;
  written_ = true;
  set("status", status);
  if (!has("steps")) set("steps", steps_);
  std::string text = "{";
  const char* sep = "\n";
  for (const auto& [key, value] : fields_) {
    text += sep;
    text += "  " + json_quote(key) + ": " + value;
    sep = ",\n";
  }
  text += "\n}\n";
  // A temporary file beside it, then a rename: a reader never sees half a summary.
  // (Where the folder cannot take a new file, the summary is written in place.)
  const std::string tmp = path_ + ".tmp";
  std::error_code ec;
  std::ofstream out(tmp);
  out << text;
  out.close();
  if (!out.fail()) {
    std::filesystem::rename(tmp, path_, ec);
    if (!ec) return;
    std::filesystem::remove(tmp, ec);
  }
  std::ofstream(path_) << text;
}

}  // namespace tutti::train
