// The draft index: per-group automata plus a global group, token budgets, LRU eviction and
// removal by rebuild. The C++ twin of bubblespec/core/suffix_index.py, with the same
// semantics step for step (same eviction choices, same rebuild order), so an index driven by
// the same calls holds the same automata. Group and sequence keys stay Python objects (any
// hashable), looked up in Python dicts owned by the index.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "automaton.hpp"

namespace nb = nanobind;

namespace bsn {

struct Seq {
  nb::object key;
  nb::object group;  // group key (None: global only)
  std::vector<int32_t> tokens;
  bool live = false, has_cur = false, has_gcur = false, used = false;
  int32_t gslot = -1;  // slot of its keyed group while has_cur (groups outlive their seqs)
  Cursor cur, gcur;
};

struct Group {
  nb::object key;
  SamPtr sam;
  std::vector<int32_t> seqs;  // sequence slots, oldest first
  int64_t ntokens = 0;
  int32_t nlive = 0;
  int32_t prev = -1, next = -1;  // LRU list (least recently used at the head)
  bool used = false;
};

[[noreturn]] inline void value_error(const std::string& msg) {
  throw nb::value_error(msg.c_str());
}

inline std::string repr_of(nb::handle h) { return std::string(nb::repr(h).c_str()); }

inline void kill(Sam& s) {
  s.dead = true;
  s.version += 1;
}

class Index {
 public:
  int32_t max_depth;
  int64_t token_budget, global_token_budget;  // -1: none
  double low_water;
  bool compact;
  Group global;
  int64_t ntokens = 0;  // tokens in keyed groups
  std::vector<Seq> seqs;
  std::vector<Group> groups;
  nb::dict seq_slot, group_slot;  // key -> slot

  Index(int32_t depth, int64_t budget, int64_t gbudget, double lw, bool cmp)
      : max_depth(depth), token_budget(budget), global_token_budget(gbudget), low_water(lw),
        compact(cmp) {
    global.sam = std::make_shared<Sam>(depth);
  }

  // ------------------------------------------------------------------ slots
  int32_t find_seq(nb::handle key) const {  // -1 if absent; TypeError if unhashable
    PyObject* v = PyDict_GetItemWithError(seq_slot.ptr(), key.ptr());
    if (!v) {
      if (PyErr_Occurred()) throw nb::python_error();
      return -1;
    }
    return static_cast<int32_t>(PyLong_AsLong(v));
  }
  int32_t find_group(nb::handle key) const {
    PyObject* v = PyDict_GetItemWithError(group_slot.ptr(), key.ptr());
    if (!v) {
      if (PyErr_Occurred()) throw nb::python_error();
      return -1;
    }
    return static_cast<int32_t>(PyLong_AsLong(v));
  }
  Seq& seq_of(nb::handle key) {
    int32_t s = find_seq(key);
    if (s < 0) value_error("unknown sequence " + repr_of(key));
    return seqs[s];
  }

  // ------------------------------------------------------------------ LRU list
  int32_t head = -1, tail = -1;
  std::vector<int32_t> free_groups, free_seqs;

  void unlink(int32_t gi) {
    Group& g = groups[gi];
    (g.prev >= 0 ? groups[g.prev].next : head) = g.next;
    (g.next >= 0 ? groups[g.next].prev : tail) = g.prev;
    g.prev = g.next = -1;
  }
  void push_back(int32_t gi) {
    Group& g = groups[gi];
    g.prev = tail;
    g.next = -1;
    (tail >= 0 ? groups[tail].next : head) = gi;
    tail = gi;
  }
  std::vector<int32_t> lru_order() const {
    std::vector<int32_t> out;
    for (int32_t gi = head; gi >= 0; gi = groups[gi].next) out.push_back(gi);
    return out;
  }

  // Mark the group in slot gi most recently used.
  void touch_slot(int32_t gi) {
    if (gi != tail) {
      unlink(gi);
      push_back(gi);
    }
  }

  // The group of `key` marked most recently used (created if `create`); -1 if absent.
  int32_t touch_group(nb::handle key, bool create) {
    int32_t gi = find_group(key);
    if (gi >= 0) {
      touch_slot(gi);
      return gi;
    }
    if (!create) return -1;
    if (free_groups.empty()) {
      gi = static_cast<int32_t>(groups.size());
      groups.emplace_back();
    } else {
      gi = free_groups.back();
      free_groups.pop_back();
    }
    Group& g = groups[gi];
    g.key = nb::borrow(key);
    g.sam = std::make_shared<Sam>(max_depth);
    g.used = true;
    g.ntokens = 0;
    g.nlive = 0;
    g.seqs.clear();
    group_slot[key] = gi;
    push_back(gi);
    return gi;
  }

  void delete_group(int32_t gi) {
    Group& g = groups[gi];
    unlink(gi);
    PyDict_DelItem(group_slot.ptr(), g.key.ptr());
    g.key = nb::object();
    g.sam.reset();
    g.seqs.clear();
    g.used = false;
    free_groups.push_back(gi);
  }

  // The automaton of `key` for a read (an empty one if the group does not exist).
  SamPtr read_sam(nb::handle key) {
    if (key.is_none()) return global.sam;
    int32_t gi = touch_group(key, false);
    return gi >= 0 ? groups[gi].sam : std::make_shared<Sam>(max_depth);
  }

  // ------------------------------------------------------------------ writes
  void add_sequence(nb::handle seq_id, nb::handle group, std::vector<int32_t>&& toks,
                    bool live, bool to_global);
  void extend_sequence(int32_t si, const int32_t* toks, size_t n);
  // Append toks[off[j], off[j + 1]) to live sequence slots[j], in order: extend_sequence
  // for each; when the token budgets cannot be exceeded (nothing to evict, so no Python
  // object is touched) without the GIL, so a caller's thread can run it beside the forward.
  void extend_sequences(const std::vector<int32_t>& slots, const std::vector<int32_t>& toks,
                        const std::vector<size_t>& off);
  void finish_sequence(nb::handle seq_id);
  void remove_sequences(const std::vector<nb::object>& ids);
  void remove_group(nb::handle group);
  size_t nbytes() const;

 private:
  void free_seq(int32_t si) {
    Seq& r = seqs[si];
    PyDict_DelItem(seq_slot.ptr(), r.key.ptr());
    r.key = nb::object();
    r.group = nb::object();
    std::vector<int32_t>().swap(r.tokens);
    r.used = false;
    free_seqs.push_back(si);
  }
  int32_t append_tokens(int32_t si, const int32_t* toks, size_t n);
  void detach(Group& g, int32_t si);
  void rebuild(Group& g, int32_t gi);
  void drop_group(int32_t gi);
  int64_t evict_oldest(Group& g, int32_t gi, int64_t target, int64_t total);
  void enforce(int32_t current);
};

}  // namespace bsn
