// What a backend provides to the dispatcher. Each backend lives in its own translation
// unit and exposes one `BackendEntry make_<name>_backend()`; the registry lists them.
#pragma once

#include <string>
#include <vector>

#include "api/params.hpp"

namespace flashtile::detail {

struct BackendEntry {
  Backend id;
  DeviceType device;
  // Higher wins in `automatic` selection among the backends that support a call.
  int priority;
  // "" when compiled in with its hardware present, else why not.
  std::string (*unavailable_reason)();
  // "" when the backend can run these (already validated) parameters, else why not.
  std::string (*unsupported_reason)(const AttentionParams&);
  // Scratch memory the backend allocates beyond q, k, v, out and lse for this call; the
  // backend sizes its allocation with this same function, so the report is what it uses.
  int64_t (*workspace_bytes)(const AttentionParams&);
  void (*run)(const AttentionParams&);
  // The backward pass, for backends that have one (null: backward refuses this backend).
  // It supports what unsupported_reason accepts; its workspace (D, fp32 dQ accumulators,
  // scratch) is sized by the same function it allocates with.
  int64_t (*backward_workspace_bytes)(const BackwardParams&) = nullptr;
  void (*run_backward)(const BackwardParams&) = nullptr;
  // A per-call priority for `automatic` forward selection (a measured rule: where this
  // backend is faster than another it outranks it), or null for `priority` everywhere.
  int (*priority_for)(const AttentionParams&) = nullptr;
  // What the backward refuses beyond unsupported_reason (null: nothing more), or "".
  std::string (*backward_unsupported_reason)(const BackwardParams&) = nullptr;
  // The same per-call rule for the backward (null: `priority`).
  int (*backward_priority_for)(const BackwardParams&) = nullptr;
};

inline int64_t no_workspace(const AttentionParams&) { return 0; }

// The journey steps (cpu_standard, cuda_naive, cuda_tiled) stay the write-up's kernels:
// full or causal attention over dense batches. Why `backend` refuses p, or "".
inline std::string journey_unsupported(const AttentionParams& p, const char* backend) {
  if (!p.has_variant()) return "";
  return std::string(backend) + " is a journey step and computes only full or causal attention "
                                "over dense batches; got " + describe_variant(p);
}

// Every backend compiled into this build, in journey order.
const std::vector<BackendEntry>& backend_registry();

}  // namespace flashtile::detail
