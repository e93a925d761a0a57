// Generalized suffix automaton with bounded-depth occurrence counts: the C++ twin of
// bubblespec/core/automaton.py. Same states, same numbering, same counts and versions, so
// every draft computed from it equals the pure-Python one; only the storage differs
// (int32 columns, branching states' transitions in a small side table).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bsn {

constexpr int32_t ROOT = 0;
constexpr int32_t NONE = -1;   // ftok: no out-transition
constexpr int32_t MULTI = -2;  // ftok: two or more, in kids[fto[v]]

// Out-transitions of a branching state. Linear scan while small, a hash index once large
// (the root and frequent tokens have thousands).
struct Kids {
  std::vector<int32_t> tok, to;
  std::unique_ptr<std::unordered_map<int32_t, int32_t>> pos;  // token -> slot, when large
  static constexpr size_t kLarge = 24;

  Kids() = default;
  Kids(const Kids& o) : tok(o.tok), to(o.to) {
    if (o.pos) pos = std::make_unique<std::unordered_map<int32_t, int32_t>>(*o.pos);
  }
  Kids(Kids&&) = default;
  Kids& operator=(Kids&&) = default;

  int32_t slot(int32_t c) const {
    if (pos) {
      auto it = pos->find(c);
      return it == pos->end() ? -1 : it->second;
    }
    const size_t n = tok.size();
    for (size_t i = 0; i < n; ++i)
      if (tok[i] == c) return static_cast<int32_t>(i);
    return -1;
  }
  int32_t get(int32_t c) const {
    int32_t s = slot(c);
    return s < 0 ? -1 : to[s];
  }
  void add(int32_t c, int32_t t) {
    tok.push_back(c);
    to.push_back(t);
    if (pos) {
      (*pos)[c] = static_cast<int32_t>(tok.size() - 1);
    } else if (tok.size() > kLarge) {
      pos = std::make_unique<std::unordered_map<int32_t, int32_t>>();
      pos->reserve(tok.size() * 2);
      for (size_t i = 0; i < tok.size(); ++i) (*pos)[tok[i]] = static_cast<int32_t>(i);
    }
  }
  size_t nbytes() const {
    size_t b = sizeof(Kids) + (tok.capacity() + to.capacity()) * sizeof(int32_t);
    if (pos) b += sizeof(*pos) + pos->bucket_count() * sizeof(void*) + pos->size() * 24;
    return b;
  }
};

// Append position of one sequence in one automaton (see SeqCursor in automaton.py).
struct Cursor {
  int32_t last = ROOT, cu = ROOT, cl = 0;
};

struct Best {  // memoised most frequent child of a high-fanout state
  int64_t version;
  int32_t tok, to, cnt;
};

struct Sam {
  int32_t max_depth;
  std::vector<int32_t> length{0}, link{-1}, occ{0}, ftok{NONE}, fto{0}, touched{0};
  std::vector<Kids> kids;
  std::unordered_map<int32_t, Best> best;
  int64_t version = 0;
  bool dead = false;

  explicit Sam(int32_t depth) : max_depth(depth) {}

  int32_t num_states() const { return static_cast<int32_t>(length.size()); }

  int32_t go(int32_t v, int32_t c) const {
    int32_t f = ftok[v];
    if (f == c) return fto[v];
    if (f == MULTI) return kids[fto[v]].get(c);
    return -1;
  }

  template <class F>
  void for_children(int32_t v, F&& fn) const {
    int32_t f = ftok[v];
    if (f == MULTI) {
      const Kids& k = kids[fto[v]];
      for (size_t i = 0; i < k.tok.size(); ++i) fn(k.tok[i], k.to[i]);
    } else if (f != NONE) {
      fn(f, fto[v]);
    }
  }

  int32_t walk(const int32_t* t, size_t n) const {
    int32_t v = ROOT;
    for (size_t i = 0; i < n && v >= 0; ++i) v = go(v, t[i]);
    return v;
  }

  size_t nbytes() const {
    size_t b = sizeof(Sam) + 6 * length.capacity() * sizeof(int32_t) +
               kids.capacity() * sizeof(Kids) + best.size() * 48;
    for (const Kids& k : kids) b += k.nbytes() - sizeof(Kids);
    return b;
  }

  // Redirect the transition on c of p from q to t (p is known to have one on c).
  void set_go(int32_t p, int32_t c, int32_t t) {
    if (ftok[p] == c) {
      fto[p] = t;
    } else {
      Kids& k = kids[fto[p]];
      k.to[k.slot(c)] = t;
    }
  }

  int32_t clone(int32_t q, int32_t p, int32_t c, int32_t new_len, int32_t ver) {
    int32_t k = num_states();
    length.push_back(new_len);
    link.push_back(link[q]);
    occ.push_back(occ[q]);
    int32_t f = ftok[q];
    ftok.push_back(f);
    if (f == MULTI) {
      Kids copy(kids[fto[q]]);
      kids.push_back(std::move(copy));
      fto.push_back(static_cast<int32_t>(kids.size() - 1));
    } else {
      fto.push_back(fto[q]);
    }
    touched.push_back(ver);
    link[q] = k;
    while (p >= 0) {  // every suffix link of p has a transition on c
      if (go(p, c) != q) break;
      set_go(p, c, k);
      p = link[p];
    }
    return k;
  }

  void add_go(int32_t p, int32_t c, int32_t t) {
    int32_t f = ftok[p];
    if (f == NONE) {
      ftok[p] = c;
      fto[p] = t;
    } else if (f == MULTI) {
      kids[fto[p]].add(c, t);
    } else {
      Kids k;
      k.add(f, fto[p]);
      k.add(c, t);
      kids.push_back(std::move(k));
      ftok[p] = MULTI;
      fto[p] = static_cast<int32_t>(kids.size() - 1);
    }
  }

  // Append tokens to the sequence whose append position is cur (automaton.py: extend).
  void extend(Cursor& cur, const int32_t* toks, size_t n) {
    const int32_t d1 = max_depth + 1;
    int32_t last = cur.last, cu = cur.cu, cl = cur.cl;
    int64_t ver = version;
    for (size_t i = 0; i < n; ++i) {
      const int32_t c = toks[i];
      ++ver;
      const int32_t v32 = static_cast<int32_t>(ver);
      int32_t q = go(last, c);
      if (q >= 0) {
        if (length[q] != length[last] + 1) q = clone(q, last, c, length[last] + 1, v32);
        last = q;
      } else {
        const int32_t nw = num_states();
        length.push_back(length[last] + 1);
        link.push_back(ROOT);
        occ.push_back(0);
        ftok.push_back(NONE);
        fto.push_back(0);
        touched.push_back(v32);
        int32_t p = last;
        while (p >= 0) {
          q = go(p, c);
          if (q >= 0) break;
          add_go(p, c, nw);
          p = link[p];
        }
        if (p >= 0) {
          if (length[p] + 1 == length[q]) {
            link[nw] = q;
          } else {
            link[nw] = clone(q, p, c, length[p] + 1, v32);
          }
        }
        last = nw;
      }
      if (cl) {
        while (length[link[cu]] >= cl) cu = link[cu];
      }
      cu = go(cu, c);
      if (++cl > d1) {
        cl = d1;
        while (length[link[cu]] >= d1) cu = link[cu];
      }
      for (int32_t x = cu; x >= 0; x = link[x]) {
        ++occ[x];
        touched[x] = v32;
      }
    }
    version = ver;
    cur.last = last;
    cur.cu = cu;
    cur.cl = cl;
  }
};

using SamPtr = std::shared_ptr<Sam>;

}  // namespace bsn
