// Which split parameter (Parameter::init_slice) a state entry belongs to: the rule that
// whole_state_dict, split_state_dict and train::Run's memory snapshots share. Internal to
// src (parallel/ and train/).
#pragma once

#include <string>
#include <vector>

#include "tutti/nn/parameter.h"

namespace tutti::parallel {

// The split parameter whose state `key` is: its name, or "<name>.<state>" (an optimizer's);
// nullptr if none. The caller checks the entry's shape where it matters.
inline const nn::Parameter* split_owner(const std::vector<nn::Parameter*>& params, const std::string& key) {
  for (const nn::Parameter* p : params) {
    if (p->init_slice.full.empty()) continue;
    if (key == p->name ||
        (key.size() > p->name.size() && key.compare(0, p->name.size(), p->name) == 0 && key[p->name.size()] == '.')) {
      return p;
    }
  }
  return nullptr;
}

}  // namespace tutti::parallel
