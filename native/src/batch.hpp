// One engine step of the proposer for a whole batch in one call: the C++ twin of
// bubblespec/core/batch.py (per request: counters and the calibration record of its last
// draft, append to the request's live sequence, the aligned pre-generated draft, drafts
// from its group and global matchers, the candidate with the highest calibrated expected
// accepted length). The calibration and per-source counters stay the Python objects of
// bubblespec.core.candidates: read once per step, written back once (also on an error).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "convert.hpp"
#include "matcher.hpp"

namespace bsn {

constexpr int64_t RESYNC = 4;

// Draft sources (candidates.SOURCES, in tie-break order); NONE: no source (empty step, or
// a draft that came from outside).
enum Src : int8_t { SRC_NONE = 0, SRC_ALIGNED = 1, SRC_GROUP = 2, SRC_GLOBAL = 3 };
inline const char* const SRC_NAMES[4] = {"", "aligned", "group", "global"};

struct Request {
  nb::object group, seq_id, matcher_obj, gmatcher_obj;
  Matcher* m = nullptr;
  Matcher* gm = nullptr;  // over the global pool, or none
  int64_t stats[8] = {0, 0, 0, 0, 0, 0, -1, 0};  // batch.Request.stats
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
      if (stats[6] < 0 && na > 0) {  // first divergence (an empty response is none): a different token, or past the response's end
        int64_t j = 0;
        const int64_t m = static_cast<int64_t>(ns);
        while (j < m && start + j < na && aligned[start + j] == s[j]) ++j;
        stats[6] = start + j;
      }
    }
    if (stats[6] >= 0 && last_draft)
      stats[5] += std::max<int64_t>(0, start + static_cast<int64_t>(ns) - 1 - std::max(start, stats[6]));
    if (!aligned_on) {
      if (n_out < RESYNC || !slice_eq(n_out - RESYNC, n_out, tail.data(), tail.size())) return;
      aligned_on = true;
      stats[7] += 1;
    }
    const int64_t lo = std::min(n_out, na), hi = std::min(n_out + std::max<int64_t>(budget, 0), na);
    if (hi > lo) res.assign(aligned.begin() + lo, aligned.begin() + hi);
  }
};

// candidates.Calibration and candidates.SourceStats for the length of one step.
struct Books {
  nb::handle cal, src;
  double prior = 0, ap0 = 0, ap1 = 0, al_acc = 0, al_stop = 0;
  double claimed[4] = {}, delivered[4] = {};
  int64_t wins[4] = {}, drafted[4] = {}, accepted[4] = {}, empty = 0;

  // The source names as interned Python strings, made once.
  static nb::handle key(int s) {
    static PyObject* keys[4] = {nullptr, nullptr, nullptr, nullptr};
    if (!keys[s]) keys[s] = PyUnicode_InternFromString(SRC_NAMES[s]);
    if (!keys[s]) throw nb::python_error();
    return keys[s];
  }
  static double num(nb::handle d, int s) { return nb::cast<double>(d[key(s)]); }
  Books(nb::handle calib, nb::handle stats) : cal(calib), src(stats) {
    prior = nb::cast<double>(cal.attr("prior"));
    nb::object ap = cal.attr("aligned_prior");
    ap0 = nb::cast<double>(ap[0]);
    ap1 = nb::cast<double>(ap[1]);
    al_acc = nb::cast<double>(cal.attr("al_acc"));
    al_stop = nb::cast<double>(cal.attr("al_stop"));
    nb::object c = cal.attr("claimed"), d = cal.attr("delivered");
    nb::object w = src.attr("wins"), dr = src.attr("drafted"), a = src.attr("accepted");
    for (int s = 1; s < 4; ++s) {
      claimed[s] = num(c, s);
      delivered[s] = num(d, s);
      wins[s] = nb::cast<int64_t>(w[key(s)]);
      drafted[s] = nb::cast<int64_t>(dr[key(s)]);
      accepted[s] = nb::cast<int64_t>(a[key(s)]);
    }
    empty = nb::cast<int64_t>(src.attr("empty"));
  }
  void write_back() {
    cal.attr("al_acc") = nb::float_(al_acc);
    cal.attr("al_stop") = nb::float_(al_stop);
    nb::object c = cal.attr("claimed"), d = cal.attr("delivered");
    nb::object w = src.attr("wins"), dr = src.attr("drafted"), a = src.attr("accepted");
    for (int s = 1; s < 4; ++s) {
      c[key(s)] = nb::float_(claimed[s]);
      d[key(s)] = nb::float_(delivered[s]);
      w[key(s)] = nb::int_(wins[s]);
      dr[key(s)] = nb::int_(drafted[s]);
      a[key(s)] = nb::int_(accepted[s]);
    }
    src.attr("empty") = nb::int_(empty);
  }
  double ratio(int s) const { return (delivered[s] + prior) / (claimed[s] + prior); }
  double aligned_rate() const { return (al_acc + ap0) / (al_acc + al_stop + ap0 + ap1); }
  void record(int s, double claim, int64_t drafted_n, int64_t acc) {
    if (s == SRC_ALIGNED) {
      al_acc += static_cast<double>(acc);
      al_stop += acc < drafted_n ? 1.0 : 0.0;
    } else {
      claimed[s] += claim;
      delivered[s] += static_cast<double>(acc);
    }
  }
};

// A candidate's expected accepted tokens cut to `budget` and its claim before rescaling
// (candidates.expected_accepted / choose).
inline double claim_of(const std::vector<double>& probs, int64_t budget) {
  PySum sum;
  const size_t n = std::min(probs.size(), static_cast<size_t>(budget));
  for (size_t i = 0; i < n; ++i) sum.add(probs[i]);
  return sum.value();
}

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
                       StepInput& in) {
  nb::object ntok = nb::hasattr(num_tokens, "tolist") ? num_tokens.attr("tolist")()
                                                       : nb::borrow(num_tokens);
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
      (dl.is_valid() && static_cast<size_t>(PySequence_Fast_GET_SIZE(dl.ptr())) < n))
    value_error("step: reqs, num_tokens and drafts need one entry per sampled list");
  PyObject** ri = PySequence_Fast_ITEMS(rl.ptr());
  PyObject** si = PySequence_Fast_ITEMS(sl.ptr());
  PyObject** ni = PySequence_Fast_ITEMS(nl.ptr());
  in.reqs.resize(n);
  in.budget.resize(n);
  in.off.assign(1, 0);
  in.goff.assign(1, 0);
  in.toks.clear();
  in.given.clear();
  for (size_t i = 0; i < n; ++i) {
    Request& r = nb::cast<Request&>(nb::handle(ri[i]));
    in.reqs[i] = &r;
    tokens_into(nb::handle(si[i]), in.toks);
    in.off.push_back(in.toks.size());
    const long long t = PyLong_AsLongLong(ni[i]);
    if (t == -1 && PyErr_Occurred()) throw nb::python_error();
    in.budget[i] = std::min<int64_t>(k, max_model_len - t - 1);
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

// batch.py: step. Phase 1 (index and matchers) and phase 2 (counters, calibration, aligned
// draft, choice) touch disjoint state, so doing all of phase 1 first changes nothing; the
// input is checked whole before either (the reference fails at the request instead).
inline nb::list step(Index& idx, nb::handle reqs, nb::handle sampled, nb::handle num_tokens,
                     int64_t k, int64_t max_model_len, nb::handle params, nb::handle calib,
                     nb::handle src_stats, bool extend_index, bool keep_out, nb::handle drafts) {
  const Params& p = params_of(params);
  const bool given = !drafts.is_none();
  StepInput in;
  read_input(idx, reqs, sampled, num_tokens, drafts, k, max_model_len, extend_index, in);
  Books bk(calib, src_stats);
  const size_t n = in.reqs.size();
  // drafts of phase 1, per batch position; the buffers are reused by the next step (a
  // step started while this one runs, from a finalizer, finds none and makes its own)
  static std::vector<Draft> pool;
  std::vector<Draft> ds;
  ds.swap(pool);
  if (ds.size() < 2 * n) ds.resize(2 * n);
  for (size_t j = 0; j < 2 * n; ++j) ds[j].token_ids.clear();
  Lanes ln;
  if (lanes_apply(idx, in, extend_index, given, ln)) {
    phase1_lanes(idx, in, ln, p, given, ds);
  } else {
    phase1_in_order(idx, in, p, given, extend_index, ds);
  }
  PyObject* res = PyList_New(static_cast<Py_ssize_t>(n));
  if (!res) throw nb::python_error();
  nb::list out = nb::steal<nb::list>(res);
  std::vector<int32_t> al;
  for (size_t i = 0; i < n; ++i) {
    Request& r = *in.reqs[i];
    const int32_t* t = in.toks.data() + in.off[i];
    const size_t ns = in.ntoks(i);
    const int64_t budget = in.budget[i];
    if (!ns) {
      PyList_SET_ITEM(res, static_cast<Py_ssize_t>(i), PyList_New(0));
      continue;
    }
    r.stats[0] += 1;
    if (keep_out) r.out.insert(r.out.end(), t, t + ns);
    if (r.last_draft) {
      const int64_t acc = static_cast<int64_t>(ns) - 1;
      r.stats[3] += acc;
      if (r.last_src != SRC_NONE) {
        if (r.last_src == SRC_ALIGNED) r.stats[4] += acc;
        bk.record(r.last_src, r.last_claim, r.last_draft, acc);
        bk.accepted[r.last_src] += acc;
      }
    }
    r.follow_aligned(t, ns, budget, al);
    const int32_t* tok = nullptr;
    size_t ntk = 0;
    if (given) {
      tok = in.given.data() + in.goff[i];
      ntk = std::min(in.goff[i + 1] - in.goff[i], static_cast<size_t>(std::max<int64_t>(budget, 0)));
    } else {
      // candidates in tie-break order; the first strictly higher expectation wins
      int8_t best = SRC_NONE;
      double best_val = 0.0, claim = 0.0;
      if (!al.empty()) {
        const double rate = bk.aligned_rate();
        PySum sum;
        double q = 1.0;
        for (size_t j = 0; j < al.size(); ++j) {
          q *= rate;
          sum.add(q);
        }
        const double c = sum.value();  // aligned drafts never exceed the budget
        if (c > best_val) best = SRC_ALIGNED, best_val = c, claim = c;
      }
      for (int j = 0; j < 2 && budget > 0; ++j) {
        const Draft& d = ds[2 * i + j];
        if (d.token_ids.empty()) continue;
        const int8_t s = static_cast<int8_t>(SRC_GROUP + j);
        const double c = claim_of(d.probs, budget);
        const double val = c * bk.ratio(s);
        if (val > best_val) best = s, best_val = val, claim = c;
      }
      if (best == SRC_NONE) {
        r.last_src = SRC_NONE;
        r.last_claim = 0.0;
        bk.empty += 1;
      } else {
        const std::vector<int32_t>& v = best == SRC_ALIGNED ? al : ds[2 * i + best - SRC_GROUP].token_ids;
        tok = v.data();
        ntk = std::min(v.size(), static_cast<size_t>(budget));
        r.last_src = best;
        r.last_claim = claim;
        bk.wins[best] += 1;
        bk.drafted[best] += static_cast<int64_t>(ntk);
      }
    }
    r.last_draft = static_cast<int64_t>(ntk);
    if (ntk) {
      r.stats[1] += 1;
      r.stats[2] += r.last_draft;
    }
    PyList_SET_ITEM(res, static_cast<Py_ssize_t>(i), to_list(tok, ntk).release().ptr());
  }
  bk.write_back();
  pool.swap(ds);
  return out;
}

}  // namespace bsn
