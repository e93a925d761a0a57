// Per-request incremental matcher: the C++ twin of bubblespec/core/matcher.py (same match
// states, same lazy refresh after appends and rebuilds, same path-jump over accepted tokens).
#pragma once

#include <cstdint>
#include <vector>

#include "draft.hpp"
#include "index.hpp"

namespace bsn {

// Advance the match (v, l) over toks (matcher.py: advance).
inline void advance(const Sam& s, int32_t& v, int32_t& l, const int32_t* toks, size_t n,
                    int32_t depth, const std::vector<int32_t>* ptoks = nullptr,
                    const std::vector<int32_t>* pstates = nullptr) {
  size_t j = 0;
  if (ptoks && !ptoks->empty()) {
    const int32_t* p = ptoks->data();
    size_t k = n < ptoks->size() ? n : ptoks->size();
    size_t same = 0;
    while (same < k && toks[same] == p[same]) ++same;
    j = same;  // full agreement: k; else the first mismatch (covers the k - 1 case too)
    if (j) {
      v = (*pstates)[j - 1];
      l += static_cast<int32_t>(j);
      if (l > depth) l = depth;
      if (j == n) return;
    }
  }
  for (size_t i = j; i < n; ++i) {
    const int32_t c = toks[i];
    while (true) {
      int32_t t = s.go(v, c);
      if (t >= 0) {
        v = t;
        break;
      }
      if (v == ROOT) {
        l = -1;
        break;
      }
      v = s.st[v].link;
      l = s.st[v].len;
    }
    if (l < depth) {
      ++l;
    } else if (s.st[s.st[v].link].len >= depth) {
      v = s.st[v].link;
    }
  }
}

inline void rematch(const Sam& s, const std::vector<int32_t>& ctx, int32_t depth, int32_t& v,
                    int32_t& l) {
  size_t n = ctx.size(), from = n > static_cast<size_t>(depth) ? n - depth : 0;
  v = ROOT;
  l = 0;
  advance(s, v, l, ctx.data() + from, n - from, depth);
}

// matcher.py: refresh (see its docstring for why this is exact).
inline void refresh(const Sam& s, int32_t& v, int32_t& l, const std::vector<int32_t>& ctx,
                    int32_t depth, int64_t since) {
  if (l) {
    while (s.st[s.st[v].link].len >= l) v = s.st[v].link;
  }
  const int32_t n = static_cast<int32_t>(ctx.size());
  if (l < depth && l < n && s.st[v].len == l && s.st[v].touched > since &&
      s.walk(ctx.data() + (n - l - 1), static_cast<size_t>(l + 1)) >= 0)
    rematch(s, ctx, depth, v, l);
}

class Matcher {
 public:
  enum Mode { GROUP, GLOBAL, FIXED };
  Index* idx;
  nb::object owner, gkey;  // the index (kept alive) and the group key
  Mode mode;
  int32_t depth;
  bool use_global;
  SamPtr s, gs;
  int32_t v = ROOT, l = 0, gv = ROOT, gl = 0;
  int64_t ver, gver;
  std::vector<int32_t> ctx, ptoks, pstates, gptoks, gpstates;
  int64_t mark = -1;  // last batch step that used it as a global matcher (sharing check)
  Draft other, scratch;  // buffers of draft(), reused across calls

  Matcher(Index* index, nb::object owner_, nb::object key, Mode m, SamPtr fixed,
          bool use_gl)
      : idx(index), owner(std::move(owner_)), gkey(std::move(key)), mode(m),
        depth(index->max_depth), use_global(use_gl) {
    s = mode == FIXED ? fixed : get_sam();
    ver = s->version;
    gs = idx->global.sam;
    gver = gs->version;
  }

  SamPtr get_sam() {
    if (mode == GROUP) return idx->groups[idx->touch_group(gkey, true)].sam;
    return idx->global.sam;  // FIXED matchers are one-off: never re-fetched
  }

  void sync() {
    if (s->version != ver) {
      ptoks.clear();
      if (s->dead) {
        s = get_sam();
        rematch(*s, ctx, depth, v, l);
      } else {
        refresh(*s, v, l, ctx, depth, ver);
      }
      ver = s->version;
    }
    if (gs->version != gver) {
      gptoks.clear();
      if (gs->dead) {
        gs = idx->global.sam;
        rematch(*gs, ctx, depth, gv, gl);
      } else {
        refresh(*gs, gv, gl, ctx, depth, gver);
      }
      gver = gs->version;
    }
  }

  void extend(const int32_t* toks, size_t n) {
    if (!n) return;
    if (s->version != ver || gs->version != gver) sync();
    advance(*s, v, l, toks, n, depth, &ptoks, &pstates);
    ptoks.clear();
    if (gs->st[ROOT].occ) advance(*gs, gv, gl, toks, n, depth, &gptoks, &gpstates);
    gptoks.clear();
    ctx.insert(ctx.end(), toks, toks + n);
    if (ctx.size() > static_cast<size_t>(4 * depth))
      ctx.erase(ctx.begin(), ctx.end() - depth);
  }

  void draft(const Params& p, Draft& best) {
    if (s->version != ver || gs->version != gver) sync();
    ptoks.clear();
    pstates.clear();
    best_draft(*s, v, l, p, &ptoks, &pstates, best, scratch);
    if (use_global && gs->st[ROOT].occ) {
      gptoks.clear();
      gpstates.clear();
      best_draft(*gs, gv, gl, p, &gptoks, &gpstates, other, scratch);
      if (other.score > best.score) std::swap(best, other);
    }
  }
};

}  // namespace bsn
