// Python bindings of bubblespec_native: SuffixIndex, Matcher, Draft, Request and step, with
// the names, signatures, results and errors of their pure-Python twins in bubblespec.core.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "batch.hpp"

using namespace bsn;

namespace {

int64_t budget_arg(nb::handle v, const char* name) {
  if (v.is_none()) return -1;
  if (!PyLong_Check(v.ptr()) || nb::cast<int64_t>(v) < 1)
    value_error(std::string(name) + " must be None or an int >= 1, got " + repr_of(v));
  return nb::cast<int64_t>(v);
}

nb::object budget_obj(int64_t b) {
  if (b < 0) return nb::none();
  return nb::int_(b);
}

void new_index(Index* self, nb::handle max_depth, nb::handle token_budget,
                 nb::handle global_token_budget, nb::handle low_water, nb::handle compact) {
  if (!PyLong_Check(max_depth.ptr()) || PyBool_Check(max_depth.ptr()) ||
      nb::cast<int64_t>(max_depth) < 1 || nb::cast<int64_t>(max_depth) > (1 << 28))
    value_error("max_depth must be an int >= 1, got " + repr_of(max_depth));
  int64_t tb = budget_arg(token_budget, "token_budget");
  int64_t gb = budget_arg(global_token_budget, "global_token_budget");
  double lw = 0.0;
  if (PyLong_Check(low_water.ptr()) || PyFloat_Check(low_water.ptr())) lw = nb::cast<double>(low_water);
  if (!(lw > 0.0 && lw <= 1.0)) value_error("low_water must be in (0, 1], got " + repr_of(low_water));
  new (self) Index(nb::cast<int32_t>(max_depth), tb, gb, lw,
                           PyObject_IsTrue(compact.ptr()) == 1);
}

nb::object make_matcher(nb::handle self, nb::handle group, nb::handle context, bool use_global) {
  Index& idx = nb::cast<Index&>(self);
  Matcher::Mode mode = Matcher::GLOBAL;
  if (!group.is_none()) {
    check_hashable(group, "group");
    idx.touch_group(group, true);
    mode = Matcher::GROUP;
  }
  nb::object m = nb::cast(new Matcher(&idx, nb::borrow(self), nb::borrow(group), mode, nullptr,
                                      use_global && !group.is_none()),
                          nb::rv_policy::take_ownership);
  std::vector<int32_t> ctx = tokens_of(context);
  nb::cast<Matcher&>(m).extend(ctx.data(), ctx.size());
  return m;
}

SamPtr read_sam(Index& idx, nb::handle group) {
  if (!group.is_none()) check_hashable(group, "group");
  return idx.read_sam(group);
}

Draft one_off(nb::handle self, nb::handle group, nb::handle context, nb::handle params,
              bool use_global) {
  Index& idx = nb::cast<Index&>(self);
  SamPtr g = read_sam(idx, group);
  std::vector<int32_t> ctx = tokens_of(context);
  Matcher m(&idx, nb::borrow(self), nb::borrow(group), Matcher::FIXED, g,
            use_global && !group.is_none());
  size_t from = ctx.size() > static_cast<size_t>(idx.max_depth) ? ctx.size() - idx.max_depth : 0;
  m.extend(ctx.data() + from, ctx.size() - from);
  Draft d;
  m.draft(params_of(params), d);
  return d;
}

nb::list keys_of(const Index& idx, const std::vector<int32_t>& slots) {
  nb::list out;
  for (int32_t s : slots) out.append(idx.seqs[s].key);
  return out;
}

}  // namespace

NB_MODULE(bubblespec_native, mod) {
  mod.doc() = "Native (C++) twin of bubblespec.core's draft index, matcher and batch step.";
  {  // the registered drafters' names, in tie-break order (sources.DRAFTER_NAMES)
    nb::list names;
    for (const DrafterEntry& e : DRAFTERS) names.append(nb::str(SRC_NAMES[e.src]));
    mod.attr("DRAFTER_NAMES") = nb::tuple(names);
  }

  nb::class_<Draft>(mod, "Draft", "A draft (bubblespec.core.draft.Draft, same fields).")
      .def_prop_ro("token_ids", [](const Draft& d) { return to_list(d.token_ids); })
      .def_prop_ro("parents", [](const Draft& d) { return to_list(d.parents); })
      .def_ro("probs", &Draft::probs)
      .def_ro("score", &Draft::score)
      .def_ro("match_len", &Draft::match_len)
      .def("__len__", [](const Draft& d) { return d.token_ids.size(); })
      .def("__repr__", [](const Draft& d) {
        return "Draft(token_ids=" + repr_of(to_list(d.token_ids)) + ", score=" +
               std::to_string(d.score) + ", match_len=" + std::to_string(d.match_len) + ")";
      });

  nb::class_<Matcher>(mod, "Matcher", "Incremental match state of one request.")
      .def("extend", [](Matcher& m, nb::handle t) {
        std::vector<int32_t> v = tokens_of(t);
        m.extend(v.data(), v.size());
      }, nb::arg("tokens").none())
      .def("advance", [](Matcher& m, nb::handle t) {
        int32_t c = token_of(t.ptr());
        m.extend(&c, 1);
      }, nb::arg("token").none())
      .def_prop_ro("match_len", [](Matcher& m) { m.sync(); return m.l; })
      .def_prop_ro("global_match_len", [](Matcher& m) { m.sync(); return m.gl; })
      .def("continuations", [](Matcher& m, bool use_global) {
        m.sync();
        const Sam& s = use_global ? *m.gs : *m.s;
        int32_t v = use_global ? m.gv : m.v;
        nb::dict d;
        s.for_children(v, [&](int32_t c, int32_t t) { d[nb::int_(c)] = s.st[t].occ; });
        return nb::make_tuple(s.st[v].occ, d);
      }, nb::arg("use_global") = false)
      .def("draft", [](Matcher& m, nb::handle params) {
        Draft d;
        m.draft(params_of(params), d);
        return d;
      }, nb::arg("params").none() = nb::none())
      .def("speculate", [](Matcher& m, nb::handle t, nb::handle params) {
        std::vector<int32_t> v = tokens_of(t);
        m.extend(v.data(), v.size());
        Draft d;
        m.draft(params_of(params), d);
        return d;
      }, nb::arg("new_tokens").none(), nb::arg("params").none() = nb::none());

  nb::class_<Index>(mod, "SuffixIndex", "Per-group suffix automata with a global group.")
      .def("__init__", &new_index, nb::arg("max_depth") = 64,
           nb::arg("token_budget").none() = nb::none(), nb::arg("global_token_budget").none() = nb::none(),
           nb::arg("low_water").none() = 0.75, nb::arg("compact").none() = false)
      .def_ro("max_depth", &Index::max_depth)
      .def_prop_ro("token_budget", [](const Index& i) { return budget_obj(i.token_budget); })
      .def_prop_ro("global_token_budget",
                   [](const Index& i) { return budget_obj(i.global_token_budget); })
      .def_ro("low_water", &Index::low_water)
      .def_ro("compact", &Index::compact)
      .def("add_sequence", [](Index& i, nb::handle sid, nb::handle group, nb::handle toks,
                              bool live, bool to_global) {
        check_hashable(sid, "seq_id");
        check_hashable(group, "group");
        if (i.find_seq(sid) >= 0) value_error("sequence " + repr_of(sid) + " already exists");
        if (group.is_none() && !to_global)
          value_error("group=None stores only in the global group: pass to_global=True");
        i.add_sequence(sid, group, tokens_of(toks), live, to_global);
      }, nb::arg("seq_id").none(), nb::arg("group").none(), nb::arg("tokens").none() = nb::tuple(), nb::kw_only(),
         nb::arg("live") = false, nb::arg("to_global") = false)
      .def("extend_sequence", [](Index& i, nb::handle sid, nb::handle toks) {
        Seq& r = i.seq_of(sid);
        if (!r.live)
          value_error("sequence " + repr_of(sid) + " is finished; only live ones can be extended");
        std::vector<int32_t> v = tokens_of(toks);
        i.extend_sequence(i.find_seq(sid), v.data(), v.size());
      }, nb::arg("seq_id").none(), nb::arg("tokens").none())
      .def("extend_sequences", [](Index& i, nb::handle ids, nb::handle toks) {
        nb::object il = nb::steal(PySequence_Fast(ids.ptr(), "seq_ids must be a sequence"));
        nb::object tl = nb::steal(PySequence_Fast(toks.ptr(), "tokens must be a sequence"));
        if (!il.is_valid() || !tl.is_valid()) throw nb::python_error();
        const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(il.ptr()));
        if (static_cast<size_t>(PySequence_Fast_GET_SIZE(tl.ptr())) != n)
          value_error("extend_sequences: one token list per sequence id");
        std::vector<int32_t> slots(n), flat;
        std::vector<size_t> off(1, 0);
        for (size_t j = 0; j < n; ++j) {
          const nb::handle sid(PySequence_Fast_ITEMS(il.ptr())[j]);
          slots[j] = i.find_seq(sid);
          if (slots[j] < 0) value_error("unknown sequence " + repr_of(sid));
          tokens_into(nb::handle(PySequence_Fast_ITEMS(tl.ptr())[j]), flat);
          off.push_back(flat.size());
        }
        i.extend_sequences(slots, flat, off);
      }, nb::arg("seq_ids"), nb::arg("tokens"),
         "Append tokens[j] to live sequence seq_ids[j], in order (extend_sequence for each, "
         "checked whole first); without the GIL when no budget can be exceeded.")
      .def("finish_sequence", [](Index& i, nb::handle sid) { i.finish_sequence(sid); },
           nb::arg("seq_id").none())
      .def("remove_sequence", [](Index& i, nb::handle sid) {
        i.remove_sequences({nb::borrow(sid)});
      }, nb::arg("seq_id").none())
      .def("remove_sequences", [](Index& i, nb::handle ids) {
        std::vector<nb::object> v;
        for (nb::handle h : nb::iter(ids)) v.push_back(nb::borrow(h));
        i.remove_sequences(v);
      }, nb::arg("seq_ids").none())
      .def("remove_group", [](Index& i, nb::handle g) { i.remove_group(g); }, nb::arg("group").none())
      .def("matcher", &make_matcher, nb::arg("group").none(), nb::arg("context").none() = nb::tuple(),
           nb::kw_only(), nb::arg("use_global") = true)
      .def("draft", &one_off, nb::arg("group").none(), nb::arg("context").none(),
           nb::arg("params").none() = nb::none(), nb::kw_only(), nb::arg("use_global") = true)
      .def("longest_match", [](Index& i, nb::handle group, nb::handle context) {
        SamPtr s = read_sam(i, group);
        std::vector<int32_t> ctx = tokens_of(context);
        int32_t v, l;
        rematch(*s, ctx, i.max_depth, v, l);
        return l;
      }, nb::arg("group").none(), nb::arg("context").none())
      .def("count", [](Index& i, nb::handle group, nb::handle tokens) {
        SamPtr s = read_sam(i, group);
        std::vector<int32_t> t = tokens_of(tokens);
        if (t.size() > static_cast<size_t>(s->max_depth) + 1)
          value_error("count() needs at most max_depth + 1 = " +
                      std::to_string(s->max_depth + 1) + " tokens, got " +
                      std::to_string(t.size()));
        int32_t v = s->walk(t.data(), t.size());
        return v < 0 ? 0 : s->st[v].occ;
      }, nb::arg("group").none(), nb::arg("tokens").none())
      .def("groups", [](const Index& i) {
        nb::list out;
        for (int32_t g : i.lru_order()) out.append(i.groups[g].key);
        return out;
      })
      .def("sequence_ids", [](Index& i, nb::handle group) {
        if (group.is_none()) return keys_of(i, i.global.seqs);
        int32_t g = i.find_group(group);
        return g < 0 ? nb::list() : keys_of(i, i.groups[g].seqs);
      }, nb::arg("group").none())
      .def("sequence_tokens", [](Index& i, nb::handle sid) { return to_list(i.seq_of(sid).tokens); },
           nb::arg("seq_id").none())
      .def_ro("num_tokens", &Index::ntokens)
      .def_prop_ro("num_global_tokens", [](const Index& i) { return i.global.ntokens; })
      .def("nbytes", &Index::nbytes);

  nb::class_<Request>(mod, "Request", "Per-request state of the batch step (batch.Request).")
      .def("__init__", [](Request* r, nb::object group, nb::object seq_id, nb::object matcher,
                          nb::object gmatcher, nb::handle aligned, bool aligned_on,
                          nb::handle tail, int64_t n_out, nb::handle out) {
        Matcher* m = &nb::cast<Matcher&>(matcher);
        Matcher* gm = gmatcher.is_none() ? nullptr : &nb::cast<Matcher&>(gmatcher);
        new (r) Request();
        r->group = std::move(group);
        r->seq_id = std::move(seq_id);
        r->m = m;
        r->matcher_obj = std::move(matcher);
        r->gm = gm;
        r->gmatcher_obj = std::move(gmatcher);
        r->has_aligned = !aligned.is_none();
        if (r->has_aligned) r->aligned = tokens_of(aligned);
        r->aligned_on = aligned_on;
        r->tail = tokens_of(tail);
        r->n_out = n_out;
        if (!out.is_none()) r->out = tokens_of(out);
      }, nb::arg("group").none(), nb::arg("seq_id").none(), nb::arg("matcher"),
         nb::arg("gmatcher").none() = nb::none(), nb::kw_only(),
         nb::arg("aligned").none() = nb::none(), nb::arg("aligned_on") = true,
         nb::arg("tail").none() = nb::tuple(), nb::arg("n_out") = 0,
         nb::arg("out").none() = nb::none())
      .def_ro("group", &Request::group)
      .def_ro("seq_id", &Request::seq_id)
      .def_ro("matcher", &Request::matcher_obj)
      .def_ro("gmatcher", &Request::gmatcher_obj)
      .def_prop_ro("counters", [](const Request& r) {
        nb::dict d;  // batch.DraftCounters by name
#define BUBBLESPEC_ITEM(name, init) d[#name] = r.c.name;
        BUBBLESPEC_COUNTERS(BUBBLESPEC_ITEM)
#undef BUBBLESPEC_ITEM
        return d;
      })
      .def_ro("last_draft", &Request::last_draft)
      .def_prop_ro("last_src", [](const Request& r) { return nb::str(SRC_NAMES[r.last_src]); })
      .def_ro("last_claim", &Request::last_claim)
      .def_prop_ro("aligned", [](const Request& r) {
        if (!r.has_aligned) return nb::object(nb::none());
        return nb::object(to_list(r.aligned));
      })
      .def_ro("aligned_on", &Request::aligned_on)
      .def_prop_ro("tail", [](const Request& r) { return to_list(r.tail); })
      .def_ro("n_out", &Request::n_out)
      .def_prop_ro("out", [](const Request& r) { return to_list(r.out); })
      .def("follow_branch", [](Request& r, nb::handle tokens, int64_t pos) {
        // batch.Request.follow_branch: the branch becomes the aligned response
        r.aligned = tokens_of(tokens);
        r.has_aligned = true;
        r.aligned_on = true;
        if (r.c.first_divergence < 0) r.c.first_divergence = pos;
      }, nb::arg("tokens"), nb::arg("pos"));

  mod.def("extend_requests", [](Index& idx, nb::handle reqs, nb::handle sampled) {
    nb::object rl = nb::steal(PySequence_Fast(reqs.ptr(), "reqs must be a sequence"));
    nb::object sl = nb::steal(PySequence_Fast(sampled.ptr(), "sampled must be a sequence"));
    if (!rl.is_valid() || !sl.is_valid()) throw nb::python_error();
    const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(sl.ptr()));
    if (static_cast<size_t>(PySequence_Fast_GET_SIZE(rl.ptr())) < n)
      value_error("extend_requests: one request per sampled list");
    std::vector<int32_t> slots, flat;
    std::vector<size_t> off(1, 0);
    for (size_t i = 0; i < n; ++i) {
      const size_t before = flat.size();
      tokens_into(nb::handle(PySequence_Fast_ITEMS(sl.ptr())[i]), flat);
      if (flat.size() == before) continue;
      Request& r = nb::cast<Request&>(nb::handle(PySequence_Fast_ITEMS(rl.ptr())[i]));
      slots.push_back(live_slot(idx, r));
      off.push_back(flat.size());
    }
    idx.extend_sequences(slots, flat, off);
  }, nb::arg("index"), nb::arg("reqs"), nb::arg("sampled"),
     "The appends a step with extend_index=False left: sampled[i] to reqs[i]'s live "
     "sequence, for each non-empty one in order (batch.extend_requests).");
  mod.def("step", [](Index& idx, nb::handle reqs, nb::handle sampled, nb::handle num_tokens,
                     int64_t k, int64_t max_model_len, nb::handle params, nb::handle calib,
                     nb::handle src, bool extend_index, bool keep_out, nb::handle drafts,
                     nb::handle caps) {
    return step(idx, reqs, sampled, num_tokens, k, max_model_len, params, calib, src,
                extend_index, keep_out, drafts, caps);
  }, nb::arg("index"), nb::arg("reqs"), nb::arg("sampled"), nb::arg("num_tokens"),
     nb::arg("k"), nb::arg("max_model_len"), nb::arg("params").none(), nb::arg("calib"),
     nb::arg("src"), nb::kw_only(), nb::arg("extend_index") = true,
     nb::arg("keep_out") = false, nb::arg("drafts").none() = nb::none(),
     nb::arg("caps").none() = nb::none(),
     "One proposer engine step for a whole batch (bubblespec.core.batch.step).");
}
