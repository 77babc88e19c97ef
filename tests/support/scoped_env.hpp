// Sets (or, with nullptr, unsets) an environment variable for one scope and restores what
// was there before, so that a run pinned from outside (a backend knob set on the command
// line) stays pinned in the tests that do not pin. The backends read their knobs per call.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace flashtile::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* outer = std::getenv(name)) outer_ = outer;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (outer_)
      setenv(name_, outer_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> outer_;
};

}  // namespace flashtile::testing
