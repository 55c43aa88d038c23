"""The modules of python/meshfuser import each other without cycles, counting imports inside
functions too (a lazy import only hides a cycle until someone imports the modules in another
order). dtensor and fusion_definition used to import each other; both now use dtensor_placements."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python", "meshfuser")


def _module_name(path):
    rel = os.path.relpath(path, os.path.join(ROOT, "python"))[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _import_graph():
    graph = {}
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        name = _module_name(path)
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        targets = set()
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                if node.module:
                    targets.add(".".join(base + [node.module]))
                else:
                    targets.update(".".join(base + [alias.name]) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("meshfuser"):
                targets.add(node.module)
        graph[name] = targets
    # Only edges between modules of the package; a package's own __init__ importing its modules is
    # how Python packages work and is not a cycle with them.
    return {m: {t for t in ts if t in graph and t != m and not m == t.rsplit(".", 1)[0]} for m, ts in graph.items()}


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(m, path):
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                return path[path.index(t):] + [t]
            if t not in state:
                found = visit(t, path + [t])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_the_graph_sees_the_known_edges():
    graph = _import_graph()
    assert "meshfuser.dtensor_placements" in graph["meshfuser.fusion_definition"]
    assert "meshfuser.fusion_definition" in graph["meshfuser.dtensor"]
    assert "meshfuser.dynamo.graph_rewrites" in graph["meshfuser.dynamo.dtensor_program"]


def test_no_import_cycles():
    assert _cycle(_import_graph()) is None


def test_a_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
