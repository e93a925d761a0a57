// Python -> C++ conversions shared by the bindings: token sequences validated exactly as
// bubblespec.core.automaton.as_tokens (ValueError on anything but ints in [0, 2**31)) and
// DraftParams read through its `_fast` tuple (memoised on the last object seen).
#pragma once

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "draft.hpp"
#include "index.hpp"

namespace bsn {

inline void check_hashable(nb::handle h, const char* what) {
  if (PyObject_Hash(h.ptr()) == -1) {
    PyErr_Clear();
    value_error(std::string(what) + " must be hashable, got " + repr_of(h));
  }
}

inline int32_t token_of(PyObject* o) {
  long long t;
  if (PyLong_Check(o)) {
    int overflow = 0;
    t = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) value_error("token ids must be in [0, 2**31), got " + repr_of(o));
  } else {
    PyObject* i = PyNumber_Index(o);
    if (!i) {
      PyErr_Clear();
      value_error("token ids must be integers, got " + repr_of(o));
    }
    int overflow = 0;
    t = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (overflow) value_error("token ids must be in [0, 2**31), got " + repr_of(o));
  }
  if (t < 0 || t > 2147483647LL)
    value_error("token ids must be in [0, 2**31), got " + std::to_string(t));
  return static_cast<int32_t>(t);
}

// Append the validated tokens of `obj` (list, tuple, array, numpy array, any iterable).
inline void tokens_into(nb::handle obj, std::vector<int32_t>& out) {
  PyObject* o = obj.ptr();
  if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    // grow at least geometrically: a step appends every request's few tokens to one
    // buffer, and an exact reserve per call would copy all of it each time (quadratic)
    const size_t need = out.size() + static_cast<size_t>(n);
    if (need > out.capacity()) out.reserve(std::max(need, 2 * out.capacity()));
    for (Py_ssize_t i = 0; i < n; ++i) out.push_back(token_of(items[i]));
    return;
  }
  nb::object seq;
  if (PyObject_HasAttrString(o, "tolist")) {
    seq = obj.attr("tolist")();
  } else {
    seq = nb::steal(PySequence_List(o));
    if (!seq.is_valid()) throw nb::python_error();
  }
  if (PyList_CheckExact(seq.ptr()) || PyTuple_CheckExact(seq.ptr())) {
    tokens_into(seq, out);
  } else {  // a scalar's tolist(): iterate whatever it is
    nb::object lst = nb::steal(PySequence_List(seq.ptr()));
    if (!lst.is_valid()) throw nb::python_error();
    tokens_into(lst, out);
  }
}

inline std::vector<int32_t> tokens_of(nb::handle obj) {
  std::vector<int32_t> out;
  tokens_into(obj, out);
  return out;
}

// A new reference to the int `t`. Ids below 2**20 share one int object per id, made on
// first use and kept for the life of the process (ints are immutable): a step's drafts then
// allocate only their lists, not one object per drafted token.
inline PyObject* token_obj(int32_t t) {
  constexpr size_t kCached = size_t(1) << 20;
  static std::vector<PyObject*> cache;
  const size_t i = static_cast<size_t>(t);
  if (i >= kCached) return PyLong_FromLong(t);
  if (i >= cache.size()) cache.resize(std::min(kCached, std::max(2 * i + 1, size_t(1) << 15)));
  PyObject*& o = cache[i];
  if (!o) {
    o = PyLong_FromLong(t);
    if (!o) return nullptr;
  }
  Py_INCREF(o);
  return o;
}

inline nb::list to_list(const int32_t* p, size_t n) {
  PyObject* l = PyList_New(static_cast<Py_ssize_t>(n));
  if (!l) throw nb::python_error();
  nb::list out = nb::steal<nb::list>(l);
  for (size_t i = 0; i < n; ++i) {
    PyObject* o = token_obj(p[i]);
    if (!o) throw nb::python_error();
    PyList_SET_ITEM(l, static_cast<Py_ssize_t>(i), o);
  }
  return out;
}

inline nb::list to_list(const std::vector<int32_t>& v) { return to_list(v.data(), v.size()); }

inline const Params& params_of(nb::handle p) {
  static PyObject* last = nullptr;  // a strong reference, kept for the process lifetime
  static Params cached;
  static const Params defaults;
  if (p.is_none()) return defaults;
  if (p.ptr() == last) return cached;
  nb::tuple f = nb::cast<nb::tuple>(p.attr("_fast"));
  Params q;
  q.cap = nb::cast<int32_t>(f[0]);
  q.factor = nb::cast<double>(f[1]);
  q.offset = nb::cast<double>(f[2]);
  q.minp = nb::cast<double>(f[3]);
  q.tree = nb::cast<bool>(f[4]);
  q.shorter = nb::cast<bool>(f[5]);
  cached = q;
  Py_XDECREF(last);
  last = p.ptr();
  Py_INCREF(last);
  return cached;
}

}  // namespace bsn
