// Generalized suffix automaton with bounded-depth occurrence counts: the C++ twin of
// bubblespec/core/automaton.py. Same states, same numbering, same counts and versions, so
// every draft computed from it equals the pure-Python one; only the storage differs
// (one row of int32 columns per state, branching states' transitions in an edge pool).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rows.hpp"

namespace bsn {

constexpr int32_t ROOT = 0;
constexpr int32_t NONE = -1;   // ftok: no out-transition
constexpr int32_t MULTI = -2;  // ftok: two or more, in the edge block at pool[st[v].fto]

// Append position of one sequence in one automaton (see SeqCursor in automaton.py).
struct Cursor {
  int32_t last = ROOT, cu = ROOT, cl = 0;
};

// One automaton state: the columns of automaton.py in one row (one cache line fetch for
// the suffix-link walks that read and write several of them).
struct State {
  int32_t len, link, occ, ftok, fto, touched;
};

// Occurrence-count walks (step 3 of automaton.py: extend) done after the structure updates
// of several tokens, possibly of several sequences and automata, all chains in lockstep so
// that the cache misses of independent chains overlap. The counts are those of walking after
// each token: the structure update never reads counts except when cloning q, and a deferred
// walk from the same cursor state over the final suffix links visits the chain it would have
// visited then plus each clone inserted into it since (right after the state it was cloned
// from: it gets the increment it would have copied). `touched` keeps the highest version
// written, which is what in-order walks leave.
struct Walk {
  State* rows;  // the automaton's rows (read after its last structure update)
  int32_t x;    // next state of the chain (-1: done)
  int32_t ver;
};

inline void count_walks(Walk* w, size_t m) {
  while (m) {
    for (size_t j = 0; j < m;) {
      State& r = w[j].rows[w[j].x];
      ++r.occ;
      if (r.touched < w[j].ver) r.touched = w[j].ver;
      w[j].x = r.link;
      if (r.link < 0) {
        w[j] = w[--m];  // order does not matter: sums and maxima
      } else {
        ++j;
      }
    }
  }
}

struct Best {  // memoised most frequent child of a high-fanout state
  int64_t version;
  int32_t tok, to, cnt;
};

// One transition of a branching state; a block's header uses the same two fields.
struct Edge {
  int32_t tok, to;
};

struct Sam {
  int32_t max_depth;
  Rows<State> st{State{0, -1, 0, NONE, 0, 0}};
  // Out-transitions of branching states, in blocks: pool[o] = {n, table or -1}, then the n
  // edges in insertion order, room for cap_of(n). A full block moves to the end of the pool
  // with twice the room (the old one is left unused; rebuilds start a fresh pool). One read
  // past the state row reaches the edges (a per-state container would take two or three).
  // Blocks of more than kLarge edges (the root and frequent tokens have thousands) also get
  // an open-addressing table of edge offsets (+1 from the block start), 0: empty.
  Rows<Edge> pool;
  std::vector<std::vector<int32_t>> tables;
  static constexpr int32_t kLarge = 16;
  std::unordered_map<int32_t, Best> best;
  int64_t version = 0;
  bool dead = false;

  explicit Sam(int32_t depth) : max_depth(depth) {}

  int32_t num_states() const { return static_cast<int32_t>(st.size()); }

  static int32_t cap_of(int32_t n) {
    int32_t c = 2;
    while (c < n) c <<= 1;
    return c;
  }
  static uint32_t hash(int32_t c) { return static_cast<uint32_t>(c) * 2654435761u; }

  // Offset (from the block start) of the edge on c in the block at o, or -1.
  int32_t edge_at(int32_t o, int32_t c) const {
    const Edge* b = pool.data() + o;
    if (b[0].to >= 0) {
      const std::vector<int32_t>& t = tables[b[0].to];
      const uint32_t mask = static_cast<uint32_t>(t.size() - 1);
      for (uint32_t h = hash(c) & mask;; h = (h + 1) & mask) {
        const int32_t e = t[h];
        if (e == 0) return -1;
        if (b[e].tok == c) return e;
      }
    }
    const int32_t n = b[0].tok;
    for (int32_t i = 1; i <= n; ++i)
      if (b[i].tok == c) return i;
    return -1;
  }

  int32_t go(int32_t v, int32_t c) const {
    const int32_t f = st[v].ftok;
    if (f == c) return st[v].fto;
    if (f == MULTI) {
      const int32_t o = st[v].fto, e = edge_at(o, c);
      return e < 0 ? -1 : pool[o + e].to;
    }
    return -1;
  }

  template <class F>
  void for_children(int32_t v, F&& fn) const {
    const int32_t f = st[v].ftok;
    if (f == MULTI) {
      const Edge* b = pool.data() + st[v].fto;
      for (int32_t i = 1, n = b[0].tok; i <= n; ++i) fn(b[i].tok, b[i].to);
    } else if (f != NONE) {
      fn(f, st[v].fto);
    }
  }

  int32_t walk(const int32_t* t, size_t n) const {
    int32_t v = ROOT;
    for (size_t i = 0; i < n && v >= 0; ++i) v = go(v, t[i]);
    return v;
  }

  size_t nbytes() const {
    size_t b = sizeof(Sam) + st.capacity() * sizeof(State) +
               pool.capacity() * sizeof(Edge) +
               tables.capacity() * sizeof(std::vector<int32_t>) + best.size() * 48;
    for (const auto& t : tables) b += t.capacity() * sizeof(int32_t);
    return b;
  }

  // Redirect the transition on c of p from q to t (p is known to have one on c).
  void set_go(int32_t p, int32_t c, int32_t t) {
    if (st[p].ftok == c) {
      st[p].fto = t;
    } else {
      const int32_t o = st[p].fto;
      pool[o + edge_at(o, c)].to = t;
    }
  }

  // A block with room for cap edges at the end of the pool (header unset); its offset.
  int32_t new_block(int32_t cap) {
    const size_t o = pool.size();
    pool.resize(o + 1 + static_cast<size_t>(cap));
    return static_cast<int32_t>(o);
  }

  // A copy of the block at o (for a clone, or moved to a larger room); its offset.
  int32_t copy_block(int32_t o, int32_t cap) {
    const int32_t n = pool[o].tok;
    const int32_t o2 = new_block(cap);
    std::copy(pool.begin() + o, pool.begin() + o + 1 + n, pool.begin() + o2);
    return o2;
  }

  void put(std::vector<int32_t>& t, const Edge* b, int32_t e) {
    const uint32_t mask = static_cast<uint32_t>(t.size() - 1);
    uint32_t h = hash(b[e].tok) & mask;
    while (t[h]) h = (h + 1) & mask;
    t[h] = e;
  }

  int32_t clone(int32_t q, int32_t p, int32_t c, int32_t new_len, int32_t ver) {
    int32_t k = num_states();
    const State& o = st[q];
    State cl{new_len, o.link, o.occ, o.ftok, o.fto, ver};
    if (o.ftok == MULTI) {
      const int32_t from = o.fto;
      cl.fto = copy_block(from, cap_of(pool[from].tok));
      if (pool[from].to >= 0) {
        tables.push_back(tables[pool[from].to]);
        pool[cl.fto].to = static_cast<int32_t>(tables.size() - 1);
      }
    }
    st.push_back(cl);
    st[q].link = k;
    while (p >= 0) {  // every suffix link of p has a transition on c
      if (go(p, c) != q) break;
      set_go(p, c, k);
      p = st[p].link;
    }
    return k;
  }

  void add_go(int32_t p, int32_t c, int32_t t) {
    const int32_t f = st[p].ftok;
    if (f == NONE) {
      st[p].ftok = c;
      st[p].fto = t;
      return;
    }
    if (f != MULTI) {
      const int32_t o = new_block(2);
      pool[o] = Edge{2, -1};
      pool[o + 1] = Edge{f, st[p].fto};
      pool[o + 2] = Edge{c, t};
      st[p].ftok = MULTI;
      st[p].fto = o;
      return;
    }
    int32_t o = st[p].fto;
    const int32_t n = pool[o].tok;
    if (n == cap_of(n)) {  // full: move to twice the room
      o = copy_block(o, 2 * n);
      st[p].fto = o;
    }
    pool[o + 1 + n] = Edge{c, t};
    pool[o].tok = n + 1;
    if (n + 1 <= kLarge) return;
    if (pool[o].to < 0) {
      tables.emplace_back();
      pool[o].to = static_cast<int32_t>(tables.size() - 1);
    }
    std::vector<int32_t>& tb = tables[pool[o].to];
    const Edge* b = pool.data() + o;
    if (tb.size() < 2 * static_cast<size_t>(n + 1)) {  // load factor <= 1/2
      tb.assign(tb.empty() ? 64 : 2 * tb.size(), 0);
      for (int32_t e = 1; e <= n + 1; ++e) put(tb, b, e);
    } else {
      put(tb, b, n + 1);
    }
  }

  // Structure and cursor update of one token appended to the sequence at cur (steps 1 and
  // 2 of automaton.py: extend): returns the start of the token's occurrence-count walk (the
  // cursor state) and its version in v32. The walk itself is left to the caller.
  int32_t push_token(Cursor& cur, int32_t c, int32_t& v32) {
    const int32_t d1 = max_depth + 1;
    int32_t last = cur.last, cu = cur.cu, cl = cur.cl;
    v32 = static_cast<int32_t>(++version);
    int32_t q = go(last, c);
    if (q >= 0) {
      if (st[q].len != st[last].len + 1) q = clone(q, last, c, st[last].len + 1, v32);
      last = q;
    } else {
      const int32_t nw = num_states();
      st.push_back(State{st[last].len + 1, ROOT, 0, NONE, 0, v32});
      int32_t p = last;
      while (p >= 0) {
        q = go(p, c);
        if (q >= 0) break;
        add_go(p, c, nw);
        p = st[p].link;
      }
      if (p >= 0) {
        if (st[p].len + 1 == st[q].len) {
          st[nw].link = q;
        } else {
          st[nw].link = clone(q, p, c, st[p].len + 1, v32);
        }
      }
      last = nw;
    }
    if (cl) {
      while (st[st[cu].link].len >= cl) cu = st[cu].link;
    }
    cu = go(cu, c);
    if (++cl > d1) {
      cl = d1;
      while (st[st[cu].link].len >= d1) cu = st[cu].link;
    }
    cur.last = last;
    cur.cu = cu;
    cur.cl = cl;
    return cu;
  }

  // Append tokens to the sequence whose append position is cur (automaton.py: extend):
  // blocks of tokens, each block's count walks after its structure updates (see Walk).
  void extend(Cursor& cur, const int32_t* toks, size_t n) {
    constexpr size_t kBlock = 16;
    Walk w[kBlock];
    for (size_t i0 = 0; i0 < n; i0 += kBlock) {
      const size_t m = n - i0 < kBlock ? n - i0 : kBlock;
      for (size_t i = 0; i < m; ++i) w[i].x = push_token(cur, toks[i0 + i], w[i].ver);
      for (size_t i = 0; i < m; ++i) w[i].rows = st.data();
      count_walks(w, m);
    }
  }
};

using SamPtr = std::shared_ptr<Sam>;

}  // namespace bsn
