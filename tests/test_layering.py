"""Import rules, checked statically on every module's source (function-level imports too).

1. The services that do not run engines (gateway, synchronizer, client) and the shared
   vocabulary packages (protocol, http) never import `bubblespec.engine`, directly or through
   other bubblespec modules: only the rank and the layers that run engines may.
2. Only `bubblespec/engine/vllm_glue.py` touches vLLM internals. Everywhere else (package,
   tests, benchmarks): vLLM is imported only from its public modules and names, no string
   names a private vLLM module (kernel registries, importlib), no attribute known to be a
   model-runner / worker internal is read, `collective_rpc` calls only bubblespec's own
   worker methods; and in the modules that drive vLLM (the engine
   package and any module importing vllm) no `obj._private` attribute of another object is
   touched and no function is patched onto another object.
3. The glue imports no bubblespec module: the engine's parts (worker extension, proposer,
   keyed sampling, pacing, faults) build on it, never it on them.
The negative controls feed the checks the accesses that were moved into the glue.

Product and lab (the section at the end; each rule with a negative control on a fabricated
graph):

3. The product (core, protocol, http, engine, synchronizer, rank, gateway, client, cluster,
   integrations, metrics, tasks, models, train, rpc, config.py, restarts.py, tls.py) never imports
   the lab (`bubblespec.sim`, `bubblespec.bench`, `bubblespec.calibration`), directly or
   through other bubblespec modules, function-level imports included. The lab imports the
   product; `bubblespec.cli` is the entry layer on top and may import everything. Every
   top-level package is in one of these layers.
4. The simulator and the benchmarks never import the calibration, which sits above both.
5. No import circles among bubblespec modules (strongly connected components of the graph
   of what each import statement loads; see `module_edges` for why a package's own
   `__init__` is not an edge of its submodules' imports).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "bubblespec"
GLUE = PACKAGE / "engine" / "vllm_glue.py"
NO_ENGINE = ("gateway", "synchronizer", "client", "protocol", "http")

PUBLIC_VLLM: dict[str, set[str]] = {
    "vllm": {"SamplingParams", "AsyncEngineArgs", "AsyncLLMEngine", "TokensPrompt",
             "__version__"},
    "vllm.sampling_params": {"SamplingParams", "RequestOutputKind", "StructuredOutputsParams"},
    "vllm.inputs": {"TokensPrompt"},
    "vllm.engine.arg_utils": {"AsyncEngineArgs"},
    "vllm.v1.engine.async_llm": {"AsyncLLM"},
    # vLLM's tool-parser registry (its plugin API, `--tool-parser-plugin`)
    "vllm.tool_parsers": {"ToolParserManager"},
    # the request bodies of vLLM's HTTP API (its wire contract), which the field-parity test
    # (tests/protocol/test_vllm_fields.py) holds the gateway's bodies against
    "vllm.entrypoints.openai.completion.protocol": {"CompletionRequest"},
    "vllm.entrypoints.openai.chat_completion.protocol": {"ChatCompletionRequest"},
    "vllm.entrypoints.scale_out.token_in_token_out.protocol": {"GenerateRequest"},
    # vLLM's weight-transfer API for RL trainers: the engine base class a backend subclasses
    # (registered through its `WeightTransferEngineFactory`, engine/weight_group.py)
    "vllm.distributed.weight_transfer.base": {"WeightTransferEngine", "WeightTransferInitInfo",
                                              "WeightTransferUpdateInfo"},
}
"""vLLM modules (and their names) that any module may import: the public API."""

RUNNER_INTERNALS = {"model_runner", "input_batch", "drafter", "rejection_sampler",
                    "topk_topp_sampler", "rejection_sample", "speculative_config",
                    "sampling_metadata", "engine_core", "model_executor"}
"""Attributes of vLLM's workers, model runners and samplers (private API whatever their
spelling)."""
RUNNER_INTERNALS_NEAR_VLLM = {"requests", "sampler"}
"""More of them, with names too common to ban outside the modules that drive vLLM."""

SELF = {"self", "cls", "super"}


# ---------------------------------------------------------------------- import graph
def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(tree: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    """Every dotted name an import statement anywhere in the tree loads (absolute)."""
    base = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = base[: len(base) - node.level + 1]
                mod = ".".join(root + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod
            yield from (f"{mod}.{a.name}" for a in node.names)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """bubblespec module -> the bubblespec modules (and their packages) it imports."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for dotted in imported_names(tree, name, path.name == "__init__.py"):
            parts = dotted.split(".")
            # importing a.b.c runs a/__init__, a/b/__init__ and a/b/c
            deps.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                        if p in modules and p != name)
        graph[name] = deps
    return graph


def engine_chain(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A chain of imports from `start` to bubblespec.engine, or None."""
    seen, stack = {start}, [[start]]
    while stack:
        chain = stack.pop()
        for dep in sorted(graph.get(chain[-1], ())):
            if dep == "bubblespec.engine" or dep.startswith("bubblespec.engine."):
                return chain + [dep]
            if dep not in seen:
                seen.add(dep)
                stack.append(chain + [dep])
    return None


def test_services_and_vocabulary_never_import_the_engine() -> None:
    modules = package_modules()
    graph = import_graph(modules)
    checked, bad = 0, []
    for name in modules:
        parts = name.split(".")
        if len(parts) > 1 and parts[1] in NO_ENGINE:
            checked += 1
            chain = engine_chain(name, graph)
            if chain:
                bad.append(" -> ".join(chain))
    assert checked >= 3, "the gateway, synchronizer and client packages were not found"
    assert not bad, "modules that must not import bubblespec.engine do:\n" + "\n".join(bad)


def test_engine_chain_finds_indirect_and_function_level_imports() -> None:
    tree = ast.parse(textwrap.dedent("""
        def f():
            from ..engine import types
    """))
    names = set(imported_names(tree, "bubblespec.gateway.x", is_package=False))
    assert "bubblespec.engine" in names and "bubblespec.engine.types" in names
    graph = {"bubblespec.gateway.a": {"bubblespec.web"}, "bubblespec.web": {"bubblespec.engine"}}
    assert engine_chain("bubblespec.gateway.a", graph) == [
        "bubblespec.gateway.a", "bubblespec.web", "bubblespec.engine"]


# ---------------------------------------------------------------------- vLLM internals
def vllm_bindings(tree: ast.AST) -> dict[str, str]:
    """Local name -> vLLM module it is bound to by an import (`import vllm.x as rs`)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vllm":
                    out[a.asname or "vllm"] = a.name if a.asname else "vllm"
    return out


def imports_vllm(tree: ast.AST) -> bool:
    return bool(vllm_bindings(tree)) or any(
        isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vllm"
        for n in ast.walk(tree))


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class VllmAccess(ast.NodeVisitor):
    """Collects what in one module reaches into vLLM internals (`bad`: empty if nothing).

    `drives_vllm`: the module drives vLLM (engine package, or it imports vllm); there the
    private-attribute and patching rules apply too."""

    def __init__(self, tree: ast.AST, drives_vllm: bool) -> None:
        self.bad: list[str] = []
        self.drives = drives_vllm
        self.bound = vllm_bindings(tree)
        self.funcs = {n.name for n in ast.walk(tree)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.internal = RUNNER_INTERNALS | (RUNNER_INTERNALS_NEAR_VLLM if drives_vllm else set())
        self.visit(tree)

    def flag(self, node: ast.AST, what: str) -> None:
        self.bad.append(f"{getattr(node, 'lineno', 0)}: {what}")

    def foreign_private(self, name: str, receiver: ast.expr) -> bool:
        return (self.drives and name.startswith("_") and not name.startswith("__")
                and root_name(receiver) not in SELF)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.split(".")[0] == "vllm" and a.name not in PUBLIC_VLLM:
                self.flag(node, f"import {a.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if (node.module or "").split(".")[0] == "vllm":
            public = PUBLIC_VLLM.get(node.module or "", set())
            for a in node.names:
                if a.name not in public:
                    self.flag(node, f"from {node.module} import {a.name}")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            parts = node.value.split(".")
            if (len(parts) > 1 and parts[0] == "vllm" and all(p.isidentifier() for p in parts)
                    and node.value not in PUBLIC_VLLM
                    and parts[-1] not in PUBLIC_VLLM.get(".".join(parts[:-1]), set())):
                self.flag(node, f"names vLLM module {node.value!r}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root = root_name(node)
        if node.attr in self.internal:
            self.flag(node, f".{node.attr} (a vLLM runner/worker internal)")
        elif (root in self.bound and isinstance(node.value, ast.Name)
              and node.attr not in PUBLIC_VLLM.get(self.bound[root], set())):
            self.flag(node, f"{root}.{node.attr} (not public vLLM)")
        if self.foreign_private(node.attr, node):
            self.flag(node, f".{node.attr} of another object")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.check_patch(node.targets, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.check_patch([node.target], node.value)
        self.generic_visit(node)

    def check_patch(self, targets: list[ast.expr], value: ast.expr) -> None:
        """A function put on another object, or anything put on a vLLM module."""
        patch = isinstance(value, ast.Lambda) or (
            isinstance(value, ast.Name) and value.id in self.funcs)
        for t in targets:
            if (self.drives and isinstance(t, ast.Attribute) and root_name(t) not in SELF
                    and (patch or root_name(t) in self.bound)):
                self.flag(t, f"patches {ast.unparse(t)}")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Name) and func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            name, receiver = node.args[1].value, node.args[0]
            if isinstance(name, str) and (
                    name in self.internal or self.foreign_private(name, receiver)
                    or self.drives and func.id == "setattr" and root_name(receiver) not in SELF):
                self.flag(node, f"{func.id}(..., {name!r})")
        if (isinstance(func, ast.Attribute) and func.attr == "collective_rpc" and node.args
                and isinstance(node.args[0], ast.Constant)
                and not str(node.args[0].value).startswith("bubblespec_")):
            self.flag(node, f"calls the vLLM worker method {node.args[0].value!r}")
        self.generic_visit(node)


def vllm_violations(source: str, drives_vllm: bool = True) -> list[str]:
    """What in `source` reaches into vLLM internals (empty: nothing)."""
    return VllmAccess(ast.parse(source), drives_vllm).bad


def checked_files() -> Iterator[Path]:
    for top in ("bubblespec", "tests", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path != GLUE and "rpc/v1" not in path.as_posix():
                yield path


def test_only_the_glue_touches_vllm_internals() -> None:
    bad = []
    for path in checked_files():
        text = path.read_text()
        drives = path.parent == GLUE.parent or imports_vllm(ast.parse(text))
        rel = path.relative_to(REPO)
        bad += [f"{rel}:{v}" for v in vllm_violations(text, drives_vllm=drives)]
    assert not bad, "vLLM internals outside engine/vllm_glue.py:\n" + "\n".join(bad)


def test_the_batcher_depends_only_on_the_protocol() -> None:
    """The SGLang API and the verl plugin share one batcher: it may not reach into either."""
    modules = package_modules()
    deps = import_graph(modules)["bubblespec.batching"]
    bad = sorted(d for d in deps - {"bubblespec"} if not d.startswith("bubblespec.protocol"))
    assert not bad, f"bubblespec.batching imports more than the protocol: {bad}"


def test_the_glue_imports_nothing_of_bubblespec() -> None:
    modules = package_modules()
    glue = module_name(GLUE)
    assert glue in modules
    deps = import_graph(modules)[glue]
    assert not deps, f"{glue} imports bubblespec modules: {sorted(deps)}"


MOVED = {
    "runner batch": "def f(runner):\n    return runner.input_batch.req_ids\n",
    "drafter": "def f(w):\n    return w.model_runner.drafter\n",
    "sampler patch": textwrap.dedent("""
        def install(runner):
            def sample(logits, generators, k, p):
                return logits
            runner.sampler.topk_topp_sampler.forward = sample
    """),
    "forward patch": textwrap.dedent("""
        def install(rsampler):
            def forward(metadata):
                return metadata
            rsampler.forward = forward
    """),
    "module patch": textwrap.dedent("""
        import vllm.v1.sample.rejection_sampler as rs
        rs.rejection_sample = wrap(rs.rejection_sample)
    """),
    "private import": "from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p\n",
    "spec decode import": "from vllm.v1.spec_decode.ngram_proposer import NgramProposer\n",
    "kernel name": 'register({"vllm.v1.sample.rejection_sampler.expand_kernel": f})\n',
    "private marker": "f._bubblespec_keyed = True\n",
    "runner private": "def f(runner):\n    return runner._bubblespec_keyed\n",
    "shutdown patch": "def stop(llm):\n    llm.shutdown = lambda *a, **k: None\n",
    "config copy": "def f(cfg, c):\n    cfg.speculative_config = c\n",
    "setattr": "def f(runner, s):\n    setattr(runner, 'forward', s)\n",
    "getattr": "def f(runner):\n    return getattr(runner, 'rejection_sampler', None)\n",
    "worker rpc": "async def f(llm):\n    await llm.collective_rpc('reload_weights')\n",
    "requests": "def f(runner, rid):\n    return runner.requests.get(rid)\n",
}


def test_the_vllm_check_catches_the_moved_accesses() -> None:
    for what, source in MOVED.items():
        assert vllm_violations(source), f"not caught: {what}"


def test_the_vllm_check_allows_the_public_api() -> None:
    source = textwrap.dedent("""
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        class E:
            def start(self, llm):
                self._llm = llm
                self.vocab = llm.model_config.get_vocab_size()
                return SamplingParams(n=1, extra_args={"k": 1})
    """)
    assert vllm_violations(source) == []


# ---------------------------------------------------------------------- product and lab
PRODUCT = ("core", "protocol", "http", "engine", "synchronizer", "rank", "gateway", "client",
           "cluster", "integrations", "metrics", "tasks", "models", "train", "rpc", "config",
           "restarts", "batching", "tls")
"""What a deployment runs (packages and top-level modules under `bubblespec/`)."""
LAB = ("sim", "bench", "calibration")
"""The lab: the simulator and the benchmarks, and the calibration above both."""
ENTRY = ("cli",)
"""The `bubblespec` command: the entry layer on top, which may import everything
(`cli/simulate.py` and `cli/bench.py` start the lab)."""
CALIBRATION_BELOW = ("sim", "bench")
"""Lab packages the calibration builds on; they never import it."""


def top_of(module: str) -> str:
    """The top-level package or module of `bubblespec` a module belongs to ('' for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def in_any(module: str, tops: tuple[str, ...]) -> bool:
    return top_of(module) in tops


def import_chain(start: str, graph: dict[str, set[str]], into: tuple[str, ...]
                 ) -> list[str] | None:
    """A chain of imports from `start` to a module under one of the top-level packages
    `into` (through any other bubblespec modules), or None."""
    seen, stack = {start}, [[start]]
    while stack:
        chain = stack.pop()
        for dep in sorted(graph.get(chain[-1], ())):
            if in_any(dep, into):
                return chain + [dep]
            if dep not in seen:
                seen.add(dep)
                stack.append(chain + [dep])
    return None


def forbidden_chains(graph: dict[str, set[str]], sources: tuple[str, ...],
                     into: tuple[str, ...]) -> list[str]:
    """Every module under `sources` that reaches `into`, with one chain each."""
    out = []
    for name in sorted(graph):
        if in_any(name, sources):
            chain = import_chain(name, graph, into)
            if chain:
                out.append(" -> ".join(chain))
    return out


def module_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """bubblespec module -> the bubblespec modules its import statements load, for finding
    circles.

    `import_graph` gives an import of `a.b.c` edges to `a` and `a.b` too, since Python runs
    their `__init__` first; that is right for what a module pulls in (the rules above), but
    it makes a false circle of every package whose `__init__` re-exports a submodule that
    imports a sibling (`a.b/__init__` -> `a.b.c` -> `a.b`). Here the packages that contain
    the importer itself are no edge of its import (they started loading before it ran),
    unless it reads a name from one (`from a.b import x`, x not a module), which runs that
    `__init__` to its end."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        deps: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            dotted = list(imported_names(node, name, is_package))
            if isinstance(node, ast.ImportFrom):
                mod, names = dotted[0], dotted[1:]
                targets = {n if n in modules else mod for n in names}
            else:
                targets = set(dotted)
            for target in targets:
                parts = target.split(".")
                prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
                loaded = [p for p in prefixes if p in modules]
                if not loaded:
                    continue
                deps.add(loaded[-1])  # the module the statement names
                deps.update(p for p in loaded[:-1] if not name.startswith(p + "."))
        deps.discard(name)
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan's
    algorithm, iterative), each sorted, in the order of their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph.get(dep, ())))))
                elif dep in on_stack:
                    low[node] = min(low[node], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def test_every_top_level_package_has_a_layer() -> None:
    tops = {top_of(name) for name in package_modules()} - {""}
    unplaced = tops - set(PRODUCT) - set(LAB) - set(ENTRY)
    assert not unplaced, f"top-level packages in no layer of this file: {sorted(unplaced)}"
    assert set(PRODUCT) <= tops and set(LAB) <= tops, "a listed layer is gone: update the lists"


def test_the_product_never_imports_the_lab() -> None:
    graph = import_graph(package_modules())
    bad = forbidden_chains(graph, PRODUCT, LAB)
    assert not bad, "product modules that import the lab:\n" + "\n".join(bad)


def test_sim_and_bench_never_import_the_calibration() -> None:
    graph = import_graph(package_modules())
    bad = forbidden_chains(graph, CALIBRATION_BELOW, ("calibration",))
    assert not bad, "sim or bench modules that import the calibration:\n" + "\n".join(bad)


def test_no_import_circles() -> None:
    found = circles(module_edges(package_modules()))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_lab_rules_catch_indirect_and_function_level_imports() -> None:
    tree = ast.parse(textwrap.dedent("""
        def f():
            from ..sim import engine_time
    """))
    names = set(imported_names(tree, "bubblespec.engine.pace", is_package=False))
    assert "bubblespec.sim.engine_time" in names
    graph = {"bubblespec.engine.pace": {"bubblespec.core.x"},
             "bubblespec.core.x": {"bubblespec.sim.engine_time"},
             "bubblespec.sim.model": {"bubblespec.calibration.replay"},
             "bubblespec.cli.simulate": {"bubblespec.sim.model", "bubblespec.calibration"},
             "bubblespec.calibration.replay": {"bubblespec.bench.paced_record"}}
    assert forbidden_chains(graph, PRODUCT, LAB) == [  # the entry layer (cli) may
        "bubblespec.core.x -> bubblespec.sim.engine_time",
        "bubblespec.engine.pace -> bubblespec.core.x -> bubblespec.sim.engine_time"]
    assert forbidden_chains(graph, CALIBRATION_BELOW, ("calibration",)) == [
        "bubblespec.sim.model -> bubblespec.calibration.replay"]


def test_the_circle_check_finds_circles_and_not_package_reexports(tmp_path) -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [
        ["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}) == [
        ["a", "b"], ["c", "d"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "bubblespec" / "lab"
    pkg.mkdir(parents=True)
    files = {
        "__init__.py": "from bubblespec.lab.model import run\n",  # re-exports a submodule
        "model.py": "from bubblespec.lab.policy import Spec\n",  # imports a sibling
        "policy.py": "import numpy\n",
        "calib.py": "from bubblespec.lab import fit\n",  # a submodule by `from pkg import`
        "fit.py": "def f():\n    from bubblespec.lab.calib import PacedRun\n",  # back: a circle
        "early.py": "from bubblespec.lab import run\n",  # a name of the package's __init__
    }
    for fname, text in files.items():
        (pkg / fname).write_text(text)
    modules = {"bubblespec.lab" + ("" if f == "__init__.py" else "." + f[:-3]): pkg / f
               for f in files}
    assert circles(import_graph(modules))  # the package rule: false circles
    edges = module_edges(modules)
    assert edges["bubblespec.lab.model"] == {"bubblespec.lab.policy"}
    assert edges["bubblespec.lab.early"] == {"bubblespec.lab"}
    assert circles(edges) == [["bubblespec.lab.calib", "bubblespec.lab.fit"]]
    files["policy.py"] = "from bubblespec.lab import run\n"  # reads the half-run __init__
    (pkg / "policy.py").write_text(files["policy.py"])
    assert ["bubblespec.lab", "bubblespec.lab.model", "bubblespec.lab.policy"] in circles(
        module_edges(modules))
