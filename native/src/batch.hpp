// One engine step of the proposer for a whole batch in one call: the C++ twin of
// bubblespec/core/batch.py (per request: counters, append to the request's live sequence,
// the aligned pre-generated draft check, then extend + draft of its matcher).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "convert.hpp"
#include "matcher.hpp"

namespace bsn {

constexpr int64_t RESYNC = 4;

struct Request {
  nb::object group, seq_id, matcher_obj;
  Matcher* m;
  int64_t stats[5] = {0, 0, 0, 0, 0};
  int64_t last_draft = 0;
  bool last_aligned = false;
  bool has_aligned = false, aligned_on = true;
  std::vector<int32_t> aligned, tail, out;
  int64_t n_out = 0;
  int32_t slot = -1;  // cached sequence slot of seq_id in the index

  // The aligned pre-generated continuation, or nothing (batch.py: aligned_draft).
  void aligned_draft(const std::vector<int32_t>& sampled, int64_t budget,
                     std::vector<int32_t>& res) {
    res.clear();
    const int64_t start = n_out;
    n_out += static_cast<int64_t>(sampled.size());
    tail.insert(tail.end(), sampled.begin(), sampled.end());
    if (tail.size() > static_cast<size_t>(RESYNC)) tail.erase(tail.begin(), tail.end() - RESYNC);
    if (!has_aligned) return;
    const int64_t na = static_cast<int64_t>(aligned.size());
    auto slice_eq = [&](int64_t a, int64_t b, const int32_t* x, size_t nx) {
      int64_t lo = std::min(a, na), hi = std::min(b, na);
      if (hi < lo) hi = lo;
      return static_cast<size_t>(hi - lo) == nx &&
             std::equal(aligned.begin() + lo, aligned.begin() + hi, x);
    };
    if (aligned_on && !slice_eq(start, n_out, sampled.data(), sampled.size())) aligned_on = false;
    if (!aligned_on) {
      if (n_out < RESYNC || !slice_eq(n_out - RESYNC, n_out, tail.data(), tail.size())) return;
      aligned_on = true;
    }
    const int64_t lo = std::min(n_out, na), hi = std::min(n_out + std::max<int64_t>(budget, 0), na);
    if (hi > lo) res.assign(aligned.begin() + lo, aligned.begin() + hi);
  }
};

inline int32_t live_slot(Index& idx, Request& r) {
  if (r.slot >= 0 && r.slot < static_cast<int32_t>(idx.seqs.size()) && idx.seqs[r.slot].used &&
      idx.seqs[r.slot].key.ptr() == r.seq_id.ptr())
    return r.slot;
  r.slot = idx.find_seq(r.seq_id);
  if (r.slot < 0) value_error("unknown sequence " + repr_of(r.seq_id));
  return r.slot;
}

// batch.py: step. `num_tokens[i]`: tokens of request i before this step's drafts.
inline nb::list step(Index& idx, nb::handle reqs, nb::handle sampled, nb::handle num_tokens,
                     int64_t k, int64_t max_model_len, nb::handle params, bool extend_index,
                     bool keep_out) {
  const Params& p = params_of(params);
  nb::object ntok = nb::hasattr(num_tokens, "tolist") ? num_tokens.attr("tolist")()
                                                       : nb::borrow(num_tokens);
  nb::list rl = nb::cast<nb::list>(reqs), sl = nb::cast<nb::list>(sampled);
  nb::object nl = nb::steal(PySequence_Fast(ntok.ptr(), "num_tokens must be a sequence"));
  if (!nl.is_valid()) throw nb::python_error();
  const size_t n = nb::len(sl);
  if (nb::len(rl) < n || static_cast<size_t>(PySequence_Fast_GET_SIZE(nl.ptr())) < n)
    value_error("step: reqs and num_tokens need one entry per sampled list");
  PyObject** nitems = PySequence_Fast_ITEMS(nl.ptr());
  nb::list res;
  std::vector<int32_t> toks, draft;
  Draft d;
  for (size_t i = 0; i < n; ++i) {
    Request& r = nb::cast<Request&>(rl[i]);
    toks.clear();
    tokens_into(sl[i], toks);
    if (toks.empty()) {
      res.append(nb::list());
      continue;
    }
    const int64_t ns = static_cast<int64_t>(toks.size());
    r.stats[0] += 1;
    if (keep_out) r.out.insert(r.out.end(), toks.begin(), toks.end());
    if (r.last_draft) {
      r.stats[3] += ns - 1;
      if (r.last_aligned) r.stats[4] += ns - 1;
    }
    if (extend_index) idx.extend_sequence(live_slot(idx, r), toks.data(), toks.size());
    const int64_t n_tok = PyLong_AsLongLong(nitems[i]);
    if (n_tok == -1 && PyErr_Occurred()) throw nb::python_error();
    const int64_t budget = std::min(k, max_model_len - n_tok - 1);
    r.aligned_draft(toks, budget, draft);
    r.last_aligned = !draft.empty();
    r.m->extend(toks.data(), toks.size());
    if (draft.empty() && budget > 0) {
      r.m->draft(p, d);
      size_t m = std::min(d.token_ids.size(), static_cast<size_t>(budget));
      draft.assign(d.token_ids.begin(), d.token_ids.begin() + static_cast<std::ptrdiff_t>(m));
    }
    r.last_draft = static_cast<int64_t>(draft.size());
    if (!draft.empty()) {
      r.stats[1] += 1;
      r.stats[2] += r.last_draft;
    }
    res.append(to_list(draft));
  }
  return res;
}

}  // namespace bsn
