// Index writes, removal and eviction (suffix_index.py, same order of operations).
#include "index.hpp"

namespace bsn {

void Index::add_sequence(nb::handle seq_id, nb::handle group, std::vector<int32_t>&& toks,
                         bool live, bool to_global) {
  int32_t gi = -1;
  int32_t si;
  if (free_seqs.empty()) {
    si = static_cast<int32_t>(seqs.size());
    seqs.emplace_back();
  } else {
    si = free_seqs.back();
    free_seqs.pop_back();
  }
  {
    Seq& r = seqs[si];
    r.key = nb::borrow(seq_id);
    r.group = nb::borrow(group);
    r.tokens = std::move(toks);
    r.live = live;
    r.used = true;
    r.has_cur = r.has_gcur = false;
  }
  const int64_t n = static_cast<int64_t>(seqs[si].tokens.size());
  if (!group.is_none()) {
    gi = touch_group(group, true);
    Group& g = groups[gi];
    Seq& r = seqs[si];
    r.cur = Cursor();
    r.has_cur = true;
    r.gslot = gi;
    g.sam->extend(r.cur, r.tokens.data(), r.tokens.size());
    g.seqs.push_back(si);
    g.ntokens += n;
    g.nlive += live;
    ntokens += n;
  }
  if (to_global) {
    Seq& r = seqs[si];
    r.gcur = Cursor();
    r.has_gcur = true;
    global.sam->extend(r.gcur, r.tokens.data(), r.tokens.size());
    global.seqs.push_back(si);
    global.ntokens += n;
    global.nlive += live;
  }
  seq_slot[seq_id] = si;
  enforce(gi);
}

// Append to live sequence slot si and its automata; the group slot it wrote (-1: none).
// Touches no Python object (extend_sequences runs it without the GIL).
int32_t Index::append_tokens(int32_t si, const int32_t* toks, size_t n) {
  Seq& r = seqs[si];
  const size_t old = r.tokens.size();
  r.tokens.insert(r.tokens.end(), toks, toks + n);
  const int32_t* t = r.tokens.data() + old;
  int32_t gi = -1;
  if (r.has_cur) {
    gi = r.gslot;
    touch_slot(gi);
    Group& g = groups[gi];
    g.sam->extend(r.cur, t, n);
    g.ntokens += static_cast<int64_t>(n);
    ntokens += static_cast<int64_t>(n);
  }
  if (r.has_gcur) {
    global.sam->extend(r.gcur, t, n);
    global.ntokens += static_cast<int64_t>(n);
  }
  return gi;
}

void Index::extend_sequence(int32_t si, const int32_t* toks, size_t n) {
  if (!seqs[si].live)
    value_error("sequence " + repr_of(seqs[si].key) + " is finished; only live ones can be extended");
  enforce(append_tokens(si, toks, n));
}

void Index::extend_sequences(const std::vector<int32_t>& slots,
                             const std::vector<int32_t>& toks, const std::vector<size_t>& off) {
  int64_t total = 0, gtotal = 0;
  for (size_t j = 0; j < slots.size(); ++j) {
    const Seq& r = seqs[slots[j]];
    if (!r.live)
      value_error("sequence " + repr_of(r.key) + " is finished; only live ones can be extended");
    const int64_t n = static_cast<int64_t>(off[j + 1] - off[j]);
    if (r.has_cur) total += n;
    if (r.has_gcur) gtotal += n;
  }
  const bool fits = (token_budget < 0 || ntokens + total <= token_budget) &&
                    (global_token_budget < 0 || global.ntokens + gtotal <= global_token_budget);
  if (!fits) {  // an eviction may free Python objects: one by one, with the GIL
    for (size_t j = 0; j < slots.size(); ++j)
      extend_sequence(slots[j], toks.data() + off[j], off[j + 1] - off[j]);
    return;
  }
  nb::gil_scoped_release release;  // under budget throughout: enforce() would do nothing
  for (size_t j = 0; j < slots.size(); ++j)
    append_tokens(slots[j], toks.data() + off[j], off[j + 1] - off[j]);
}

void Index::finish_sequence(nb::handle seq_id) {
  Seq& r = seq_of(seq_id);
  if (!r.live) return;
  r.live = false;
  if (r.has_cur) groups[r.gslot].nlive -= 1;
  if (r.has_gcur) global.nlive -= 1;
}

void Index::remove_sequences(const std::vector<nb::object>& ids) {
  std::vector<int32_t> slots;
  for (const nb::object& sid : ids) {
    int32_t s = find_seq(sid);
    if (s < 0) value_error("unknown sequence " + repr_of(sid));
    slots.push_back(s);
  }
  std::vector<int32_t> touched;  // group slots in first-touch order; -2: the global group
  auto touch = [&](int32_t gi) {
    for (int32_t x : touched)
      if (x == gi) return;
    touched.push_back(gi);
  };
  std::vector<int32_t> done;
  for (int32_t s : slots) {
    bool seen = false;
    for (int32_t x : done) seen |= x == s;
    if (seen) continue;
    done.push_back(s);
    Seq& r = seqs[s];
    const bool cur = r.has_cur, gcur = r.has_gcur;
    // the record leaves the id table first (suffix_index.py pops it before detaching)
    if (cur) {
      int32_t gi = r.gslot;
      detach(groups[gi], s);
      touch(gi);
    }
    if (gcur) {
      detach(global, s);
      touch(-2);
    }
  }
  for (int32_t gi : touched) {
    if (gi == -2) {
      rebuild(global, -2);
    } else {
      rebuild(groups[gi], gi);
    }
  }
}

void Index::remove_group(nb::handle group) {
  int32_t gi = find_group(group);
  if (gi < 0) value_error("unknown group " + repr_of(group));
  std::vector<nb::object> ids;
  for (int32_t s : groups[gi].seqs) ids.push_back(seqs[s].key);
  remove_sequences(ids);
  gi = find_group(group);
  if (gi >= 0) drop_group(gi);  // an empty group (e.g. made by a matcher) goes too
}

void Index::detach(Group& g, int32_t si) {
  Seq& r = seqs[si];
  for (size_t i = 0; i < g.seqs.size(); ++i) {
    if (g.seqs[i] == si) {
      g.seqs.erase(g.seqs.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  g.ntokens -= n;
  g.nlive -= r.live;
  if (&g == &global) {
    r.has_gcur = false;
  } else {
    r.has_cur = false;
    ntokens -= n;
  }
  if (!r.has_cur && !r.has_gcur) free_seq(si);
}

void Index::rebuild(Group& g, int32_t gi) {
  kill(*g.sam);
  if (g.seqs.empty() && gi != -2) {
    delete_group(gi);
    return;
  }
  g.sam = std::make_shared<Sam>(max_depth);
  for (int32_t s : g.seqs) {
    Seq& r = seqs[s];
    Cursor c;
    g.sam->extend(c, r.tokens.data(), r.tokens.size());
    (gi == -2 ? r.gcur : r.cur) = c;
  }
}

void Index::drop_group(int32_t gi) {
  Group& g = groups[gi];
  std::vector<int32_t> list = g.seqs;
  for (int32_t s : list) detach(g, s);
  kill(*g.sam);
  delete_group(gi);
}

int64_t Index::evict_oldest(Group& g, int32_t gi, int64_t target, int64_t total) {
  bool dropped = false;
  std::vector<int32_t> list = g.seqs;
  for (int32_t s : list) {
    if (total <= target) break;
    if (!seqs[s].live) {
      total -= static_cast<int64_t>(seqs[s].tokens.size());
      detach(g, s);
      dropped = true;
    }
  }
  if (dropped) rebuild(g, gi);
  return total;
}

void Index::enforce(int32_t current) {
  const int64_t budget = token_budget;
  if (budget >= 0 && ntokens > budget) {
    for (int32_t gi : lru_order()) {
      if (ntokens <= budget) break;
      if (gi != current && groups[gi].nlive == 0) drop_group(gi);
    }
    if (ntokens > budget) {
      const int64_t target = static_cast<int64_t>(static_cast<double>(budget) * low_water);
      for (int32_t gi : lru_order()) {
        if (ntokens <= target) break;
        Group& g = groups[gi];
        evict_oldest(g, gi, target + g.ntokens - ntokens, g.ntokens);
      }
    }
  }
  const int64_t gb = global_token_budget;
  if (gb >= 0 && global.ntokens > gb)
    evict_oldest(global, -2, static_cast<int64_t>(static_cast<double>(gb) * low_water),
                 global.ntokens);
}

size_t Index::nbytes() const {
  size_t total = global.sam->nbytes();
  for (const Group& g : groups)
    if (g.used) total += g.sam->nbytes() + sizeof(Group) + g.seqs.capacity() * 4;
  for (const Seq& r : seqs)
    if (r.used) total += sizeof(Seq) + r.tokens.capacity() * sizeof(int32_t);
  return total;
}

}  // namespace bsn
