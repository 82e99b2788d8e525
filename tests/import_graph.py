"""The static import graph of fastattn's modules, and its cycles.

Read from the source (ast), not by importing: every ``import fastattn...``, ``from fastattn...
import ...`` and relative ``from . import ...`` / ``from ..x import ...`` in fastattn/*.py and
fastattn/*/*.py, at module level or inside functions (lazy imports count: they run when the
function does). ``from P import name`` is an edge to the module P.name when that file exists,
else to P itself (a name P's __init__ defines). Importing a submodule also runs its package's
__init__, but that edge is left out: with it every package that imports its own submodules
would be a cycle.

    python tests/import_graph.py [PACKAGE_DIR]
        the strongly connected components (the modules on cycles) and the shortest cycle
        through each module, of fastattn/ or of another copy of it (an older commit's)
"""
import ast
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fastattn")
PACKAGE = "fastattn"


def module_files(root=ROOT, package=PACKAGE):
    """{module name: path} of package/*.py and package/*/*.py (an __init__.py is the package),
    and of the compiled binding (its .pyx source)."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        if depth > 1:
            continue
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
        parts = [package] + ([] if rel == "." else rel.split(os.sep))
        for name in filenames:
            if not name.endswith((".py", ".pyx")):    # .pyx: the compiled binding, a leaf
                continue
            stem = name.rsplit(".", 1)[0]
            files[".".join(parts if stem == "__init__" else parts + [stem])] = \
                os.path.join(dirpath, name)
    return files


def _targets(node, module, is_package, modules):
    """The modules of `modules` an Import/ImportFrom node in `module` brings in."""
    if isinstance(node, ast.Import):
        bases = [a.name for a in node.names]
        names = []
    else:
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            up = here[:len(here) - (node.level - 1)] if node.level > 1 else here
            base = ".".join(up + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        bases = [base]
        names = [a.name for a in node.names]
    out = set()
    for base in bases:
        if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
            continue
        # ``import fastattn.a.b`` runs fastattn.a.b; keep the longest prefix that is a module
        parts = base.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        base_mod = ".".join(parts)
        if not names:
            if base_mod:
                out.add(base_mod)
            continue
        for name in names:
            sub = f"{base}.{name}"
            if sub in modules:
                out.add(sub)
            elif base_mod:
                out.add(base_mod)
    return out


def import_graph(root=ROOT, package=PACKAGE):
    """{module: set of fastattn modules it imports (anywhere in its source)}."""
    files = module_files(root, package)
    graph = {}
    for module, path in files.items():
        if path.endswith(".pyx"):                   # Cython: imports nothing of ours
            graph[module] = set()
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = os.path.basename(path) == "__init__.py"
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, module, is_package, files)
        edges.discard(module)
        graph[module] = edges
    return graph


def components(graph):
    """The strongly connected components of more than one module, each sorted (Tarjan)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(comps)


def shortest_cycles(graph):
    """For each module in a cycle, the shortest cycle through it (a list of modules from the
    smallest back to it), each cycle once: a readable witness per module where listing every
    elementary cycle would run to hundreds."""
    found = []
    for comp in components(graph):
        members = set(comp)
        for start in comp:
            parent, queue, cycle = {start: None}, [start], None
            while queue and cycle is None:
                nxt = []
                for v in queue:
                    for w in sorted(graph[v] & members):
                        if w == start:
                            path = [v]
                            while parent[path[-1]] is not None:
                                path.append(parent[path[-1]])
                            cycle = path[::-1]
                            break
                        if w not in parent:
                            parent[w] = v
                            nxt.append(w)
                    if cycle is not None:
                        break
                queue = nxt
            i = cycle.index(min(cycle))
            cycle = cycle[i:] + cycle[:i]
            if cycle + cycle[:1] not in found:
                found.append(cycle + cycle[:1])
    return found


def involves(cycle, *prefixes):
    """Whether a cycle (or component) holds a module named by one of `prefixes` (the module
    itself or one inside that package)."""
    return any(m == p or m.startswith(p + ".") for m in cycle for p in prefixes)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    graph = import_graph(argv[0]) if argv else import_graph()
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} import edges")
    comps = components(graph)
    if not comps:
        print("no cycles")
        return 0
    for comp in comps:
        print(f"component of {len(comp)}: {', '.join(comp)}")
    for cycle in shortest_cycles(graph):
        mark = "  [cli/bench]" if involves(cycle, "fastattn.cli", "fastattn.bench") else ""
        print(" -> ".join(cycle) + mark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
