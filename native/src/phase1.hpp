// Phase 1 of the proposer's batch step (batch.hpp): the step's input read and checked whole,
// then every request's emitted tokens appended to its live sequence and its matchers
// extended and drafting, either in batch order or with the groups interleaved (lanes) so
// the dependent reads of different automata overlap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "request.hpp"

namespace bsn {

// Everything of one step's input, converted and checked before any state changes.
struct StepInput {
  std::vector<Request*> reqs;
  std::vector<int64_t> budget;
  std::vector<int32_t> toks, given;  // emitted (and given draft) tokens, flat
  std::vector<size_t> off, goff;     // request i: toks[off[i], off[i + 1])
  size_t ntoks(size_t i) const { return off[i + 1] - off[i]; }
};

inline int32_t live_slot(Index& idx, Request& r) {
  if (r.slot >= 0 && r.slot < static_cast<int32_t>(idx.seqs.size()) && idx.seqs[r.slot].used &&
      idx.seqs[r.slot].key.ptr() == r.seq_id.ptr())
    return r.slot;
  r.slot = idx.find_seq(r.seq_id);
  if (r.slot < 0) value_error("unknown sequence " + repr_of(r.seq_id));
  return r.slot;
}

inline void read_input(Index& idx, nb::handle reqs, nb::handle sampled, nb::handle num_tokens,
                       nb::handle drafts, int64_t k, int64_t max_model_len, bool extend_index,
                       StepInput& in, nb::handle caps = nb::none()) {
  nb::object ntok = nb::hasattr(num_tokens, "tolist") ? num_tokens.attr("tolist")()
                                                       : nb::borrow(num_tokens);
  nb::object cl;  // per-request caps (batch.py: step's `caps`), or none
  if (!caps.is_none()) {
    nb::object cv = nb::hasattr(caps, "tolist") ? caps.attr("tolist")() : nb::borrow(caps);
    cl = nb::steal(PySequence_Fast(cv.ptr(), "caps must be a sequence"));
    if (!cl.is_valid()) throw nb::python_error();
  }
  nb::object rl = nb::steal(PySequence_Fast(reqs.ptr(), "reqs must be a sequence"));
  nb::object sl = nb::steal(PySequence_Fast(sampled.ptr(), "sampled must be a sequence"));
  nb::object nl = nb::steal(PySequence_Fast(ntok.ptr(), "num_tokens must be a sequence"));
  if (!rl.is_valid() || !sl.is_valid() || !nl.is_valid()) throw nb::python_error();
  nb::object dl;
  if (!drafts.is_none()) {
    dl = nb::steal(PySequence_Fast(drafts.ptr(), "drafts must be a sequence"));
    if (!dl.is_valid()) throw nb::python_error();
  }
  const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(sl.ptr()));
  if (static_cast<size_t>(PySequence_Fast_GET_SIZE(rl.ptr())) < n ||
      static_cast<size_t>(PySequence_Fast_GET_SIZE(nl.ptr())) < n ||
      (dl.is_valid() && static_cast<size_t>(PySequence_Fast_GET_SIZE(dl.ptr())) < n) ||
      (cl.is_valid() && static_cast<size_t>(PySequence_Fast_GET_SIZE(cl.ptr())) < n))
    value_error("step: reqs, num_tokens, drafts and caps need one entry per sampled list");
  PyObject** ri = PySequence_Fast_ITEMS(rl.ptr());
  PyObject** si = PySequence_Fast_ITEMS(sl.ptr());
  PyObject** ni = PySequence_Fast_ITEMS(nl.ptr());
  in.reqs.resize(n);
  in.budget.resize(n);
  in.off.assign(1, 0);
  in.goff.assign(1, 0);
  in.off.reserve(n + 1);
  in.goff.reserve(n + 1);
  in.toks.clear();
  in.given.clear();
  in.toks.reserve(8 * n);  // a request emits its accepted draft + 1 token: a few per step
  for (size_t i = 0; i < n; ++i) {
    Request& r = nb::cast<Request&>(nb::handle(ri[i]));
    in.reqs[i] = &r;
    tokens_into(nb::handle(si[i]), in.toks);
    in.off.push_back(in.toks.size());
    const long long t = PyLong_AsLongLong(ni[i]);
    if (t == -1 && PyErr_Occurred()) throw nb::python_error();
    int64_t cap = k;
    if (cl.is_valid()) {
      const long long c = PyLong_AsLongLong(PySequence_Fast_ITEMS(cl.ptr())[i]);
      if (c == -1 && PyErr_Occurred()) throw nb::python_error();
      cap = std::min<int64_t>(k, c);
    }
    in.budget[i] = std::min<int64_t>(cap, max_model_len - t - 1);
    if (in.ntoks(i) && dl.is_valid())
      tokens_into(nb::handle(PySequence_Fast_ITEMS(dl.ptr())[i]), in.given);
    in.goff.push_back(in.given.size());
    if (in.ntoks(i) && extend_index && !idx.seqs[live_slot(idx, r)].live)
      value_error("sequence " + repr_of(r.seq_id) + " is finished; only live ones can be extended");
  }
  for (size_t i = 0; i < n; ++i) in.reqs[i]->slot_mark = -1;
  for (size_t i = 0; i < n; ++i) {
    if (in.reqs[i]->slot_mark >= 0) value_error("step: a request appears twice in the batch");
    in.reqs[i]->slot_mark = static_cast<int64_t>(i);
  }
}

// Warm the lines request r touches first: its live sequence's cursor states and its
// matcher's match state and drafted path (states of the same automaton).
inline void prefetch_request(Index& idx, const Request& r) {
  if (r.slot >= 0 && r.slot < static_cast<int32_t>(idx.seqs.size())) {
    const Seq& q = idx.seqs[r.slot];
    if (q.has_cur && q.gslot >= 0 && q.gslot < static_cast<int32_t>(idx.groups.size())) {
      const Sam* s = idx.groups[q.gslot].sam.get();
      if (s && q.cur.cu < s->num_states() && q.cur.last < s->num_states()) {
        __builtin_prefetch(&s->st[q.cur.cu], 1);
        __builtin_prefetch(&s->st[q.cur.last], 1);
      }
    }
  }
  const Matcher* m = r.m;
  const Sam& s = *m->s;
  __builtin_prefetch(&s.st[m->v]);
  const size_t np = std::min<size_t>(m->pstates.size(), 4);
  for (size_t j = 0; j < np; ++j) __builtin_prefetch(&s.st[m->pstates[j]]);
}

// Phase 1 of request i, after its live sequence took its tokens: its matchers take them
// too and draft (when they may) into ds[2i] (group) and ds[2i + 1] (global).
inline void match(const StepInput& in, size_t i, const Params& p, bool given,
                  std::vector<Draft>& ds) {
  Request& r = *in.reqs[i];
  const int32_t* t = in.toks.data() + in.off[i];
  const size_t ns = in.ntoks(i);
  Matcher* ms[2] = {r.m, given ? nullptr : r.gm};
  for (int j = 0; j < 2; ++j) {
    if (!ms[j]) continue;
    ms[j]->extend(t, ns);
    if (!given && in.budget[i] > 0) ms[j]->draft(p, ds[2 * i + j]);
  }
}

// Phase 1 with the requests of different groups interleaved: in rounds, the r-th request
// of every group appends its tokens (token by token across groups), all their count walks
// run in lockstep, then each drafts. Requests of one group keep their order, and nothing is
// shared across groups (checked by `lanes_apply`), so every automaton and matcher sees the
// calls it sees in batch order; group recency is then replayed in batch order.
struct Lanes {
  std::vector<std::vector<size_t>> reqs;  // per group (first-seen order): its requests
  std::vector<int32_t> slot;               // its group slot
};

inline bool lanes_apply(Index& idx, const StepInput& in, bool extend_index, bool given,
                        Lanes& ln) {
  if (!extend_index || in.reqs.size() < 2) return false;
  static int64_t stamp = 0;
  ++stamp;
  int64_t total = 0;
  std::vector<int32_t> lane_of(idx.groups.size(), -1);
  for (size_t i = 0; i < in.reqs.size(); ++i) {
    const size_t ns = in.ntoks(i);
    if (!ns) continue;
    total += static_cast<int64_t>(ns);
    const Request& r = *in.reqs[i];
    const Seq& q = idx.seqs[r.slot];
    if (!q.has_cur || q.has_gcur || r.m->mode != Matcher::GROUP ||
        r.m->s.get() != idx.groups[q.gslot].sam.get())
      return false;
    if (r.gm && !given) {  // a global matcher reads only the global group, unchanged here
      if (r.gm->mode != Matcher::GLOBAL || r.gm->mark == stamp) return false;
      r.gm->mark = stamp;
    }
    int32_t& l = lane_of[q.gslot];
    if (l < 0) {
      l = static_cast<int32_t>(ln.reqs.size());
      ln.reqs.emplace_back();
      ln.slot.push_back(q.gslot);
    }
    ln.reqs[l].push_back(i);
  }
  if (idx.token_budget >= 0 && idx.ntokens + total > idx.token_budget) return false;
  return ln.reqs.size() > 1;
}

inline void phase1_lanes(Index& idx, const StepInput& in, const Lanes& ln, const Params& p,
                         bool given, std::vector<Draft>& ds) {
  size_t rounds = 0;
  for (const auto& l : ln.reqs) rounds = std::max(rounds, l.size());
  std::vector<Walk> walks;
  walks.reserve(in.toks.size());  // at most one walk per emitted token in a round
  std::vector<size_t> cur;  // request of each lane in this round (or none)
  for (size_t rd = 0; rd < rounds; ++rd) {
    cur.clear();
    size_t longest = 0;
    for (size_t l = 0; l < ln.reqs.size(); ++l) {
      if (rd >= ln.reqs[l].size()) continue;
      const size_t i = ln.reqs[l][rd];
      const size_t ns = in.ntoks(i);
      Seq& q = idx.seqs[in.reqs[i]->slot];
      q.tokens.insert(q.tokens.end(), in.toks.data() + in.off[i], in.toks.data() + in.off[i] + ns);
      idx.groups[ln.slot[l]].ntokens += static_cast<int64_t>(ns);
      idx.ntokens += static_cast<int64_t>(ns);
      cur.push_back(l);
      longest = std::max(longest, ns);
    }
    walks.clear();
    for (size_t j = 0; j < longest; ++j) {
      for (size_t l : cur) {
        const size_t i = ln.reqs[l][rd];
        if (j >= in.ntoks(i)) continue;
        Seq& q = idx.seqs[in.reqs[i]->slot];
        Sam& s = *idx.groups[ln.slot[l]].sam;
        Walk w{nullptr, 0, 0};
        w.x = s.push_token(q.cur, in.toks[in.off[i] + j], w.ver);
        walks.push_back(w);
      }
    }
    size_t at = 0;  // rows are final now: no more appends this round
    for (size_t j = 0; j < longest; ++j) {
      for (size_t l : cur) {
        if (j < in.ntoks(ln.reqs[l][rd])) walks[at++].rows = idx.groups[ln.slot[l]].sam->st.data();
      }
    }
    count_walks(walks.data(), walks.size());
    for (size_t c = 0; c < cur.size(); ++c) {
      if (c + 2 < cur.size()) prefetch_request(idx, *in.reqs[ln.reqs[cur[c + 2]][rd]]);
      match(in, ln.reqs[cur[c]][rd], p, given, ds);
    }
  }
  for (size_t i = 0; i < in.reqs.size(); ++i)  // group recency as batch order leaves it
    if (in.ntoks(i)) idx.touch_slot(idx.seqs[in.reqs[i]->slot].gslot);
}

inline void phase1_in_order(Index& idx, const StepInput& in, const Params& p, bool given,
                            bool extend_index, std::vector<Draft>& ds) {
  constexpr size_t AHEAD = 3;
  const size_t n = in.reqs.size();
  for (size_t i = 0; i < n; ++i) {
    if (i + AHEAD < n) prefetch_request(idx, *in.reqs[i + AHEAD]);
    const size_t ns = in.ntoks(i);
    if (!ns) continue;
    if (extend_index) idx.extend_sequence(in.reqs[i]->slot, in.toks.data() + in.off[i], ns);
    match(in, i, p, given, ds);
  }
}

}  // namespace bsn
