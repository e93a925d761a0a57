// One engine step of the proposer for a whole batch in one call: the C++ twin of
// bubblespec/core/batch.py (per request: counters and the calibration record of its last
// draft, append to the request's live sequence, the aligned pre-generated draft, a
// candidate from every registered drafter (DRAFTERS below, core/drafters.py's twin), the
// one with the highest calibrated expected accepted length). The calibration and
// per-drafter counters stay the Python objects of bubblespec.core.candidates: read once
// per step, written back once (also on an error).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "phase1.hpp"

namespace bsn {

// candidates.Calibration and candidates.DrafterStats for the length of one step.
struct Books {
  nb::handle cal, src;
  double prior = 0, ap0 = 0, ap1 = 0, al_acc = 0, al_stop = 0;
  double claimed[SRC_COUNT] = {}, delivered[SRC_COUNT] = {};
  int64_t wins[SRC_COUNT] = {}, drafted[SRC_COUNT] = {}, accepted[SRC_COUNT] = {}, empty = 0;

  // The drafter names as interned Python strings, made once.
  static nb::handle key(int s) {
    static PyObject* keys[SRC_COUNT] = {};
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
    for (int s = 1; s < SRC_COUNT; ++s) {
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
    for (int s = 1; s < SRC_COUNT; ++s) {
      c[key(s)] = nb::float_(claimed[s]);
      d[key(s)] = nb::float_(delivered[s]);
      w[key(s)] = nb::int_(wins[s]);
      dr[key(s)] = nb::int_(drafted[s]);
      a[key(s)] = nb::int_(accepted[s]);
    }
    src.attr("empty") = nb::int_(empty);
  }
  // candidates.Calibration.ratio: 1 for the aligned drafter (calibrated by its rate)
  double ratio(int s) const {
    return s == SRC_ALIGNED ? 1.0 : (delivered[s] + prior) / (claimed[s] + prior);
  }
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

// One drafter's candidate for a request at this step: its tokens and its claim (expected
// accepted tokens as stated, before the calibration's rescaling).
struct Cand {
  const std::vector<int32_t>* toks = nullptr;
  double claim = 0.0;
};

// What a drafter reads for request i: its aligned continuation (cut to the budget), the
// matchers' drafts of phase 1 (two per request: group, global), the budget, the aligned
// drafter's rate.
struct DraftCtx {
  const std::vector<int32_t>& al;
  const std::vector<Draft>& ds;
  size_t i;
  int64_t budget;
  double aligned_rate;
};

// drafters.AlignedDrafter: geometric path probabilities (candidates.aligned_candidate).
inline bool aligned_drafter(const DraftCtx& x, Cand& c) {
  if (x.al.empty()) return false;
  PySum sum;
  double q = 1.0;
  for (size_t j = 0; j < x.al.size(); ++j) {
    q *= x.aligned_rate;
    sum.add(q);
  }
  c.toks = &x.al;
  c.claim = sum.value();  // aligned drafts never exceed the budget
  return true;
}

// drafters.MatcherDrafter: the draft phase 1 made with the request's J-th matcher.
template <int J>
inline bool matcher_drafter(const DraftCtx& x, Cand& c) {
  if (x.budget <= 0) return false;
  const Draft& d = x.ds[2 * x.i + J];
  if (d.token_ids.empty()) return false;
  c.toks = &d.token_ids;
  c.claim = claim_of(d.probs, x.budget);
  return true;
}

// The registered drafters, in tie-break order (drafters.DRAFTERS; their Src values name
// them in the counters). A new drafter is a function above and its line here.
struct DrafterEntry {
  int8_t src;
  bool (*candidate)(const DraftCtx&, Cand&);
};
inline constexpr DrafterEntry DRAFTERS[] = {
    {SRC_ALIGNED, aligned_drafter},
    {SRC_GROUP, matcher_drafter<0>},
    {SRC_GLOBAL, matcher_drafter<1>},
};
static_assert(sizeof(DRAFTERS) / sizeof(DRAFTERS[0]) == SRC_COUNT - 1,
              "one registered drafter per Src value");

// batch.py: step. Phase 1 (index and matchers) and phase 2 (counters, calibration, aligned
// draft, choice) touch disjoint state, so doing all of phase 1 first changes nothing; the
// input is checked whole before either (the reference fails at the request instead).
inline nb::list step(Index& idx, nb::handle reqs, nb::handle sampled, nb::handle num_tokens,
                     int64_t k, int64_t max_model_len, nb::handle params, nb::handle calib,
                     nb::handle src_stats, bool extend_index, bool keep_out, nb::handle drafts,
                     nb::handle caps = nb::none()) {
  const Params& p = params_of(params);
  const bool given = !drafts.is_none();
  StepInput in;
  read_input(idx, reqs, sampled, num_tokens, drafts, k, max_model_len, extend_index, in, caps);
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
    r.c.steps += 1;
    if (keep_out) r.out.insert(r.out.end(), t, t + ns);
    if (r.last_draft) {
      const int64_t acc = static_cast<int64_t>(ns) - 1;
      r.c.accepted += acc;
      if (r.last_src != SRC_NONE) {
        if (r.last_src == SRC_ALIGNED) r.c.accepted_pregen += acc;
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
      // every drafter's candidate, in tie-break order; the first strictly higher
      // expectation wins
      int8_t best = SRC_NONE;
      double best_val = 0.0, claim = 0.0;
      const std::vector<int32_t>* best_toks = nullptr;
      const DraftCtx x{al, ds, i, budget, bk.aligned_rate()};
      for (const DrafterEntry& e : DRAFTERS) {
        Cand c;
        if (!e.candidate(x, c)) continue;
        const double val = c.claim * bk.ratio(e.src);
        if (val > best_val) best = e.src, best_val = val, claim = c.claim, best_toks = c.toks;
      }
      if (best == SRC_NONE) {
        r.last_src = SRC_NONE;
        r.last_claim = 0.0;
        bk.empty += 1;
      } else {
        tok = best_toks->data();
        ntk = std::min(best_toks->size(), static_cast<size_t>(budget));
        r.last_src = best;
        r.last_claim = claim;
        bk.wins[best] += 1;
        bk.drafted[best] += static_cast<int64_t>(ntk);
      }
    }
    r.last_draft = static_cast<int64_t>(ntk);
    if (ntk) {
      r.c.drafts += 1;
      r.c.draft_tokens += r.last_draft;
    }
    PyList_SET_ITEM(res, static_cast<Py_ssize_t>(i), to_list(tok, ntk).release().ptr());
  }
  bk.write_back();
  pool.swap(ds);
  return out;
}

}  // namespace bsn
