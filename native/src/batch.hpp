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

#include "phase1.hpp"

namespace bsn {

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
