// Path and tree drafters over an automaton: the C++ twin of bubblespec/core/draft.py.
// Probabilities are computed with the same double operations in the same order (the build
// disables FMA contraction), so drafts, probabilities and scores equal the Python ones bit
// for bit; scores are summed as the CPython built against sums a list of floats.
#pragma once

#include <Python.h>

#include <cmath>
#include <cstdint>
#include <queue>
#include <tuple>
#include <vector>

#include "automaton.hpp"

namespace bsn {

struct Draft {
  std::vector<int32_t> token_ids, parents;
  std::vector<double> probs;
  double score = 0.0;
  int32_t match_len = 0;
};

struct Params {  // DraftParams._fast
  int32_t cap = 16;
  double factor = 1.0, offset = 0.0, minp = 0.1;
  bool tree = false, shorter = true;
};

// sum() of a list of floats as the CPython this module is built for computes it: sequential
// up to 3.11, Neumaier-compensated from 3.12 (the first item is added to the int 0 exactly).
struct PySum {
  double f = 0.0, c = 0.0;
  void add(double x) {
#if PY_VERSION_HEX >= 0x030C0000
    double t = f + x;
    if (std::fabs(f) >= std::fabs(x)) {
      c += (f - t) + x;
    } else {
      c += (x - t) + f;
    }
    f = t;
#else
    f += x;
#endif
  }
  double value() const { return (c != 0.0 && std::isfinite(c)) ? f + c : f; }
};

inline double seq_sum(const std::vector<double>& v) {
  PySum s;
  for (double x : v) s.add(x);
  return s.value();
}

inline int32_t budget_of(int32_t l, const Params& p) {
  int64_t n = static_cast<int64_t>(static_cast<double>(l) * p.factor + p.offset + 1e-6);
  return n > p.cap ? p.cap : static_cast<int32_t>(n);
}

// (token, target, count) of the most frequent transition of a branching state, ties by
// lowest token id; memoised per automaton version for high-fanout states.
inline void best_child(Sam& s, int32_t v, int32_t& bc, int32_t& bt, int32_t& bk) {
  const Edge* k = s.pool.data() + s.st[v].fto;
  const int32_t n = k[0].tok;
  Best* memo = nullptr;
  if (n > 8) {
    memo = &s.best[v];
    if (memo->version == s.version && memo->to > 0) {  // targets are never the root
      bc = memo->tok, bt = memo->to, bk = memo->cnt;
      return;
    }
  }
  bc = -1, bt = -1, bk = -1;
  for (int32_t i = 1; i <= n; ++i) {
    const int32_t c = k[i].tok, cnt = s.st[k[i].to].occ;
    if (cnt > bk || (cnt == bk && c < bc)) bc = c, bt = k[i].to, bk = cnt;
  }
  if (memo) *memo = Best{s.version, bc, bt, bk};
}

inline void set_path_parents(Draft& d) {
  d.parents.resize(d.token_ids.size());
  for (size_t i = 0; i < d.parents.size(); ++i) d.parents[i] = static_cast<int32_t>(i) - 1;
}

// Greedy path (draft.py: path_draft). Returns false when `beat >= 0` and the score provably
// cannot exceed it.
inline bool path_draft(Sam& s, int32_t v, int32_t l, int32_t max_tokens, double minp,
                       std::vector<int32_t>* states, double beat, Draft& d) {
  d.token_ids.clear();
  d.probs.clear();
  d.score = 0.0;
  if (max_tokens > 0) {
    const int32_t depth = s.max_depth;
    double prob = 1.0;
    PySum sum;
    int32_t tot = s.st[v].occ;
    const int32_t room = depth - l;
    for (int32_t i = 0; i < max_tokens; ++i) {
      int32_t c = s.st[v].ftok, t, cnt;
      if (c >= 0) {
        t = s.st[v].fto;
        cnt = s.st[t].occ;
      } else if (c == NONE) {
        break;
      } else {
        best_child(s, v, c, t, cnt);
      }
      if (cnt != tot) {
        prob = prob * (static_cast<double>(cnt) / static_cast<double>(tot));
        if (prob < minp) break;
        if (beat >= 0.0 &&
            sum.value() + prob * static_cast<double>(max_tokens - i) < beat - 1e-9)
          return false;
      }
      d.token_ids.push_back(c);
      d.probs.push_back(prob);
      sum.add(prob);
      if (i >= room && s.st[s.st[t].link].len >= depth) {
        t = s.st[t].link;
        tot = s.st[t].occ;
      } else {
        tot = cnt;
      }
      v = t;
      if (states) states->push_back(t);
    }
    d.score = sum.value();
  }
  set_path_parents(d);
  return true;
}

// Best-first token tree (draft.py: tree_draft).
inline void tree_draft(Sam& s, int32_t v, int32_t l, int32_t max_tokens, double minp,
                       Draft& d) {
  using Item = std::tuple<double, int64_t, int32_t, int32_t, int32_t, int32_t>;
  // (-p, order, token, target, window length, parent): a min-heap as heapq
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  int64_t order = 0;
  const int32_t depth = s.max_depth;
  std::vector<std::tuple<int32_t, int32_t, int32_t>> kids;  // (count, token, target)
  auto expand = [&](int32_t v, int32_t l, double prob, int32_t parent) {
    int32_t total = s.st[v].occ;
    kids.clear();
    s.for_children(v, [&](int32_t c, int32_t t) { kids.emplace_back(s.st[t].occ, c, t); });
    if (kids.size() > 8 && minp > 0.0) {
      double floor = minp * static_cast<double>(total) / prob * (1.0 - 1e-9);
      size_t w = 0;
      for (auto& k : kids)
        if (static_cast<double>(std::get<0>(k)) >= floor) kids[w++] = k;
      kids.resize(w);
    }
    std::sort(kids.begin(), kids.end(), [](const auto& a, const auto& b) {
      return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) > std::get<0>(b)
                                              : std::get<1>(a) < std::get<1>(b);
    });
    for (auto& [cnt, c, t] : kids) {
      double p = prob * (static_cast<double>(cnt) / static_cast<double>(total));
      if (p < minp) break;
      heap.emplace(-p, order++, c, t, l + 1, parent);
    }
  };
  d.token_ids.clear();
  d.parents.clear();
  d.probs.clear();
  if (max_tokens > 0) expand(v, l, 1.0, -1);
  while (!heap.empty() && static_cast<int32_t>(d.token_ids.size()) < max_tokens) {
    auto [negp, ord, c, t, tl, parent] = heap.top();
    heap.pop();
    int32_t idx = static_cast<int32_t>(d.token_ids.size());
    d.token_ids.push_back(c);
    d.parents.push_back(parent);
    d.probs.push_back(-negp);
    if (tl > depth) {
      tl = depth;
      while (s.st[s.st[t].link].len >= depth) t = s.st[t].link;
    }
    if (idx + 1 < max_tokens) expand(t, tl, -negp, idx);
  }
  d.score = seq_sum(d.probs);
}

// Draft from the longest match and the shorter ones (draft.py: best_draft). For path
// drafts, path_toks/states receive the path drafted from (v, l).
// `d` is scratch space for the shorter candidates (kept by the caller so that its buffers
// are reused across calls).
inline void best_draft(Sam& s, int32_t v, int32_t l, const Params& p,
                       std::vector<int32_t>* path_toks, std::vector<int32_t>* states,
                       Draft& best, Draft& d) {
  int32_t n = budget_of(l, p);
  if (p.tree) {
    tree_draft(s, v, l, n, p.minp, best);
  } else {
    path_draft(s, v, l, n, p.minp, states, -1.0, best);
    if (path_toks) path_toks->insert(path_toks->end(), best.token_ids.begin(),
                                     best.token_ids.end());
  }
  best.match_len = l;
  if (!p.shorter) return;
  for (int32_t u = s.st[v].link; u > 0; u = s.st[u].link) {
    int32_t lu = s.st[u].len;
    n = budget_of(lu, p);
    double score = best.score;
    if (static_cast<double>(n) <= score) break;
    int32_t f = s.st[u].ftok, first;
    if (f >= 0) {
      first = s.st[s.st[u].fto].occ;
    } else if (f == NONE) {
      first = 0;
    } else {
      int32_t bc, bt;
      best_child(s, u, bc, bt, first);
    }
    double ou = static_cast<double>(s.st[u].occ);
    if (static_cast<double>(first) / ou >= p.minp &&
        static_cast<double>(first) * n > score * ou * (1.0 - 1e-9)) {
      bool ok;
      if (p.tree) {
        tree_draft(s, u, lu, n, p.minp, d);
        ok = true;
      } else {
        ok = path_draft(s, u, lu, n, p.minp, nullptr, score, d);
      }
      if (ok && d.score > score) {
        d.match_len = lu;
        std::swap(best, d);
      }
    }
  }
}

}  // namespace bsn
