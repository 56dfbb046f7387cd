"""The package's import structure, read from its source: no import cycle (lazy imports included), and the core
never imports the measurement tools (efftx/perf/ and the command aliases that run them)."""

import ast
import pathlib

from conftest import REPO

TOOL_ALIASES = {"efftx.ab", "efftx.bench", "efftx.peers", "efftx.gpu_bench", "efftx.lowering"}


def _imports() -> dict[str, set[str]]:
  """efftx module → the efftx modules it imports anywhere in its file (a package's __init__ for `from P import
  name` where name is not a module; the parent packages an import runs, except the module's own)."""
  root = pathlib.Path(REPO)
  files = {}
  for path in (root / "efftx").rglob("*.py"):
    name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    files[name] = path
  graph = {}
  for name, path in files.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        found |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level:
          module = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [module])])
        found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names}
    for module in list(found):
      parts = module.split(".")
      found |= {".".join(parts[:i]) for i in range(2, len(parts)) if not name.startswith(".".join(parts[:i]) + ".")}
    graph[name] = {m for m in found if m in files and m != name}
  return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle of graph (a path that returns to its start), None if there is none."""
  state, path = {}, []

  def visit(node):
    state[node] = "open"
    path.append(node)
    for child in sorted(graph[node]):
      if state.get(child) == "open":
        return path[path.index(child) :] + [child]
      if child not in state and (found := visit(child)):
        return found
    state[node] = "done"
    path.pop()
    return None

  return next((found for node in sorted(graph) if node not in state and (found := visit(node))), None)


def test_no_import_cycle_in_efftx():
  assert _cycle(_imports()) is None, " → ".join(_cycle(_imports()))


def test_the_cycle_finder_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_core_never_imports_the_tools():
  graph = _imports()
  core = {m for m in graph if not m.startswith("efftx.perf") and m not in TOOL_ALIASES}
  assert {(m, d) for m in core for d in graph[m] if d.startswith("efftx.perf") or d in TOOL_ALIASES} == set()
  assert "efftx.perf.step" in graph["efftx.perf.bench"] and "efftx.mixers.spec" in graph["efftx.mixers.attention"]
