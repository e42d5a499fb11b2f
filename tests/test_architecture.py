"""The package's rooms (docs/architecture.md) hold: the pure ``ops`` import nothing of fairseq, no module imports
another in a cycle, and each room imports only the rooms below it in the drawing."""

import ast
from pathlib import Path

from tests.conftest import PACKAGE, REPO

# room -> the rooms it may import (docs/architecture.md draws the same); a room is a top-level module or folder of
# the package, or a sub-package of qa/
ALLOWED = {
    "ops": set(),
    "qa.ops": {"ops"},
    "atomic_files": set(),
    "layers": {"ops"},
    "checkpoints": {"atomic_files"},
    "compat": {"ops", "checkpoints"},
    "refresh": {"ops", "layers", "checkpoints"},
    "lm": {"ops", "layers", "refresh", "checkpoints", "compat"},
    "qa.data": {"atomic_files"},
    "qa.formats": {"qa.data"},
    "qa.hf": set(),
    "qa": {"ops", "qa.ops", "qa.data", "layers", "refresh", "checkpoints", "compat"},
    # the transformers side of an export: the QA model, its data and decoding, wrapped for transformers
    "qa.hf_model": {"qa", "qa.ops", "qa.data", "qa.hf", "atomic_files"},
    # the LM scripts and what every console script shares: the QA scripts import it, so it knows nothing of QA
    "scripts": {"ops", "layers", "lm", "checkpoints", "compat", "__init__"},
    "qa.scripts": {"ops", "qa.ops", "qa.data", "qa.formats", "qa.hf", "qa.hf_model", "qa", "layers", "checkpoints",
                   "atomic_files", "scripts", "__init__"},
    "__init__": {"compat", "lm", "qa"},
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SUBROOMS = {"ops", "data", "formats", "hf", "scripts"}


def room(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "qa" and len(parts) > 2 or parts[0] == "qa" and len(parts) == 2 and parts[1] in SUBROOMS:
        return f"qa.{parts[1]}"
    return parts[0]


def imports(path: Path) -> list[str]:
    """The modules ``path`` imports (``from X import y`` names X.y when X.y is a module of the package)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (REPO / candidate.replace(".", "/")).with_suffix(".py").is_file() or (
                    REPO / candidate.replace(".", "/")
                ).is_dir()
                found.append(candidate if is_module else node.module)
    return found


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_the_pure_rooms_import_nothing_of_fairseq():
    for module, path in MODULES.items():
        if room(module) not in ("ops", "qa.ops"):
            continue
        for name in imports(path):
            top = name.split(".")[0]
            outside = top == "fairseq_clusterformer" and room(name) not in ("ops", "qa.ops")
            assert top not in ("fairseq", "omegaconf", "hydra") and not outside, f"{module} imports {name}: not pure"


def test_each_room_imports_only_the_rooms_below_it():
    for module, path in MODULES.items():
        here = room(module)
        for name in imports(path):
            if not name.startswith("fairseq_clusterformer"):
                continue
            there = room(name)
            assert there == here or there in ALLOWED[here], f"{module} ({here}) imports {name} ({there})"


def test_no_module_imports_another_in_a_cycle():
    # imports inside functions count: one put there to dodge a cycle at import time still ties the modules together
    graph = {
        module: {name for name in imports(path) if name in MODULES and name != module}
        for module, path in MODULES.items()
    }
    # a package imports its own sub-modules (registration); that is not a cycle of the code
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for dep in graph[module]:
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*trail, module, dep])
            if dep not in state:
                visit(dep, [*trail, module])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


def test_the_drawing_names_every_room():
    page = (REPO / "docs" / "architecture.md").read_text()
    rooms = {room(module) for module in MODULES}
    missing = sorted(
        r for r in rooms if r != "__init__" and f"`{r.replace('.', '/')}/`" not in page and f"`{r}.py`" not in page
    )
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_package_imports_nothing_of_the_experiments():
    # benchmarks/ (the measurements and the experiments' reports) uses the package; the package never uses it
    for module, path in MODULES.items():
        outside = [name for name in imports(path) if name.split(".")[0] == "benchmarks"]
        assert not outside, f"{module} imports {outside}: the experiments live in benchmarks/, outside the package"
