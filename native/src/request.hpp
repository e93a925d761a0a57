// A request of the proposer's batch step: its matchers, counters, calibration record of
// its last draft, and the aligned pre-generated draft it follows (bubblespec/core/batch.py:
// Request and follow_aligned). Shared by the step's two phases (phase1.hpp, batch.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "convert.hpp"
#include "matcher.hpp"

namespace bsn {

constexpr int64_t RESYNC = 4;

// Drafters (sources.DRAFTER_NAMES, in tie-break order); NONE: no drafter (empty step, or
// a draft that came from outside). Registered in batch.hpp's DRAFTERS.
enum Src : int8_t { SRC_NONE = 0, SRC_ALIGNED = 1, SRC_GROUP = 2, SRC_GLOBAL = 3, SRC_COUNT = 4 };
inline const char* const SRC_NAMES[SRC_COUNT] = {"", "aligned", "group", "global"};

// A request's draft counters by name: batch.DraftCounters, field for field (X(name, initial
// value)); module.cpp hands them to Python as {name: value}. A new counter is one line here.
#define BUBBLESPEC_COUNTERS(X)                                                  \
  X(steps, 0) X(drafts, 0) X(draft_tokens, 0) X(accepted, 0) X(accepted_pregen, 0) \
  X(accepted_after_divergence, 0) X(first_divergence, -1) X(recouplings, 0) X(ran_out, 0)

struct Counters {
#define BUBBLESPEC_FIELD(name, init) int64_t name = init;
  BUBBLESPEC_COUNTERS(BUBBLESPEC_FIELD)
#undef BUBBLESPEC_FIELD
};

struct Request {
  nb::object group, seq_id, matcher_obj, gmatcher_obj;
  Matcher* m = nullptr;
  Matcher* gm = nullptr;  // over the global pool, or none
  Counters c;  // batch.Request.counters
  int64_t last_draft = 0;
  int8_t last_src = SRC_NONE;
  double last_claim = 0.0;
  bool has_aligned = false, aligned_on = true;
  std::vector<int32_t> aligned, tail, out;
  int64_t n_out = 0;
  int32_t slot = -1;  // cached sequence slot of seq_id in the index
  int64_t slot_mark = -1;  // its position in the step being read (duplicate check)

  // The aligned pre-generated continuation, or nothing (batch.py: follow_aligned).
  void follow_aligned(const int32_t* s, size_t ns, int64_t budget, std::vector<int32_t>& res) {
    res.clear();
    const int64_t start = n_out;
    n_out += static_cast<int64_t>(ns);
    tail.insert(tail.end(), s, s + ns);
    if (tail.size() > static_cast<size_t>(RESYNC)) tail.erase(tail.begin(), tail.end() - RESYNC);
    if (!has_aligned) return;
    const int64_t na = static_cast<int64_t>(aligned.size());
    auto slice_eq = [&](int64_t a, int64_t b, const int32_t* x, size_t nx) {
      int64_t lo = std::min(a, na), hi = std::min(b, na);
      if (hi < lo) hi = lo;
      return static_cast<size_t>(hi - lo) == nx &&
             std::equal(aligned.begin() + lo, aligned.begin() + hi, x);
    };
    if (aligned_on && !slice_eq(start, n_out, s, ns)) {
      aligned_on = false;
      if (c.first_divergence < 0 && na > 0) {  // first divergence (an empty response is none): a different token, or past the response's end
        int64_t j = 0;
        const int64_t m = static_cast<int64_t>(ns);
        while (j < m && start + j < na && aligned[start + j] == s[j]) ++j;
        c.first_divergence = start + j;
        c.ran_out = c.first_divergence >= na ? 1 : 0;
      }
    }
    if (c.first_divergence >= 0 && last_draft)
      c.accepted_after_divergence += std::max<int64_t>(
          0, start + static_cast<int64_t>(ns) - 1 - std::max(start, c.first_divergence));
    if (!aligned_on) {
      if (n_out < RESYNC || !slice_eq(n_out - RESYNC, n_out, tail.data(), tail.size())) return;
      aligned_on = true;
      c.recouplings += 1;
    }
    const int64_t lo = std::min(n_out, na), hi = std::min(n_out + std::max<int64_t>(budget, 0), na);
    if (hi > lo) res.assign(aligned.begin() + lo, aligned.begin() + hi);
  }
};

}  // namespace bsn
