"""The package's layers (docs/ARCHITECTURE.md, "Layers"), read from its imports.

Every `import` of a module of the package, at the top of a file or inside a
function, read with `ast` (nothing is imported): no module imports one of a
higher layer, and no imports close a circle, between packages or between modules.
The modules of `JAX_FREE` import none of `HEAVY` (their top-level imports, followed
through the package), and at most `MAX_LAZY` imports of the package's own modules
sit inside functions, each marked `# lazy: <reason>`.
"""
import ast
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    'vmoe_sparse_ot')
PACKAGE = 'vmoe_sparse_ot'

# Bottom to top. A name is a top-level module or package of vmoe_sparse_ot; a
# package's `__main__` is a command line, in the top layer.
LAYERS = (
    ('foundations', ('errors', 'trees', 'values', 'atomic', 'workdir_layout', 'config_keys',
                     'quiet_logs', 'filesystem')),
    ('ot', ('ot',)),
    ('nn, data', ('nn', 'data')),
    ('parallel, checkpoints', ('parallel', 'checkpoints')),
    ('initialization', ('initialization',)),
    ('config', ('config',)),
    ('train', ('train',)),
    ('evaluate', ('evaluate',)),
    ('commands', ('main', 'quickstart', 'fewshot', 'export', 'plot', 'plotting_style',
                  'inference', 'experiments', '__init__', '__main__')),
)
LEVEL = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def modules(root: str) -> dict[str, str]:
  """{dotted module name: path} of every .py file under `root` (the package dir)."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d != '__pycache__']
    for f in filenames:
      if f.endswith('.py'):
        rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].replace(os.sep, '.')
        name = PACKAGE + ('' if rel == '__init__' else '.' + rel.removesuffix('.__init__'))
        out[name] = os.path.join(dirpath, f)
  return out


def _import_nodes(tree: ast.AST, top_level: bool):
  """The import statements of `tree`: all, or (`top_level`) those run at import,
  outside function bodies."""
  if not top_level:
    yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return
  for node in ast.iter_child_nodes(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node
    elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      yield from _import_nodes(node, top_level)


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
                    known: set[str]) -> list[str]:
  """Dotted names an import statement in `module` imports (relative ones resolved)."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  base = node.module or ''
  if node.level:  # relative: resolve against this module's package
    parts = module.split('.')
    parts = parts if is_package else parts[:-1]
    parts = parts[:len(parts) - node.level + 1]
    base = '.'.join(parts + ([base] if base else []))
  # `from pkg import sub` imports the submodule when there is one.
  return [f'{base}.{a.name}' if f'{base}.{a.name}' in known else base for a in node.names]


def imports(path: str, module: str, known: set[str], *, top_level: bool = False,
            external: bool = False) -> set[str]:
  """The package's modules that `module` (at `path`) imports, anywhere in the file
  (`top_level`: only outside functions); `external`: the other packages' instead."""
  with open(path) as f:
    tree = ast.parse(f.read())
  out = set()
  for node in _import_nodes(tree, top_level):
    names = _imported_names(node, module, path.endswith('__init__.py'), known)
    out.update(n for n in names
               if (n.split('.')[0] != PACKAGE if external else
                   n.split('.')[0] == PACKAGE and n != module))
  return out


def layer_of(module: str) -> tuple[str, int]:
  parts = module.split('.')
  top = '__init__' if len(parts) == 1 else parts[1]
  if parts[-1] == '__main__':
    top = '__main__'
  return top, LEVEL[top]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    state[node] = 'done'
    stack.pop()
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def problems(root: str = ROOT) -> list[str]:
  """Each import that goes up a layer, and one circle per level (packages, modules)."""
  found = modules(root)
  known = set(found)
  edges = {m: imports(p, m, known) for m, p in found.items()}
  out = []
  for module, targets in sorted(edges.items()):
    for target in sorted(targets):
      level, target_level = layer_of(module)[1], layer_of(target)[1]
      if target_level > level:
        out.append(f'{module} (layer {LAYERS[level][0]}) imports {target} '
                   f'(layer {LAYERS[target_level][0]}), a layer above it')
  packages = {}
  for module, targets in edges.items():
    for target in targets:
      a, b = layer_of(module)[0], layer_of(target)[0]
      if a != b and '__main__' not in (a, b) and '__init__' not in (a, b):
        packages.setdefault(a, set()).add(b)
  cycle = _cycle(packages)
  if cycle:
    out.append('packages import each other in a circle: ' + ' -> '.join(cycle))
  # Between modules: an edge to a package stands for its __init__; a package's
  # __init__ importing its own submodules is how packages are built, not a circle.
  module_graph = {m: {t for t in ts if not t.startswith(m + '.')} for m, ts in edges.items()}
  cycle = _cycle(module_graph)
  if cycle:
    out.append('modules import each other in a circle: ' + ' -> '.join(cycle))
  return out


def test_no_import_goes_up_a_layer_or_closes_a_circle():
  assert problems() == []


def test_every_top_level_module_has_a_layer():
  tops = {layer_of(m)[0] for m in modules(ROOT)}
  assert tops <= set(LEVEL), sorted(tops - set(LEVEL))


@pytest.mark.parametrize('planted,expected', [
    # An upward import hidden in a function of the bottom layer.
    ('ot/selection.py', 'vmoe_sparse_ot.ot.selection (layer ot) imports '
                        'vmoe_sparse_ot.train.trainer (layer train), a layer above it'),
    # A circle between two packages of one layer.
    ('parallel.py', 'packages import each other in a circle'),
])
def test_a_planted_upward_import_or_circle_is_named(tmp_path, planted, expected):
  copy = tmp_path / PACKAGE
  shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns('__pycache__'))
  line = ('\n\ndef _planted():\n  from vmoe_sparse_ot.train import trainer  # noqa\n'
          if planted.startswith('ot/') else
          '\n\ndef _planted():\n  from vmoe_sparse_ot import checkpoints  # noqa\n')
  if planted == 'parallel.py':  # checkpoints must import parallel too for a circle
    with open(copy / 'checkpoints' / 'layout.py', 'a') as f:
      f.write('\n\ndef _planted():\n  from vmoe_sparse_ot import parallel  # noqa\n')
  with open(copy / planted, 'a') as f:
    f.write(line)
  found = problems(str(copy))
  assert any(expected in p for p in found), found
  assert problems() == []  # the package itself is untouched


# Modules that import none of HEAVY (docs/ARCHITECTURE.md): `import vmoe_sparse_ot`
# (`load` comes on first use), the foundations every layer shares, the pp parser
# that config validation runs before TensorFlow, and `python -m vmoe_sparse_ot.data`
# (its --help and a bad name answer without them). TFDS itself imports TensorFlow
# only on use; the subprocess check below sees what really loads.
JAX_FREE = (
    PACKAGE,
    *(f'{PACKAGE}.{name}' for name in LAYERS[0][1]),
    f'{PACKAGE}.data',
    f'{PACKAGE}.data.pp',
    f'{PACKAGE}.data.pp_general',
    f'{PACKAGE}.data.pp_image',
    f'{PACKAGE}.data.pp_registry',
    f'{PACKAGE}.data.randaug',
    f'{PACKAGE}.data.__main__',
)
HEAVY = ('jax', 'jaxlib', 'flax', 'optax', 'orbax', 'chex', 'clu', 'tensorflow')


def _parents(name: str) -> list[str]:
  """`name` and the packages above it, which importing it runs: a.b.c -> a, a.b, a.b.c."""
  parts = name.split('.')
  return ['.'.join(parts[:i]) for i in range(1, len(parts) + 1)]


def heavy_imports(root: str = ROOT, listed: tuple[str, ...] = JAX_FREE) -> list[str]:
  """For each module of `listed` that imports one of HEAVY at import time: one line,
  with the chain of top-level imports through the package that gets there."""
  found = modules(root)
  known = set(found)
  edges = {m: {p for t in imports(path, m, known, top_level=True) for p in _parents(t)
               if p in known and p != m} | (set(_parents(m)[:-1]) & known)
           for m, path in found.items()}
  out = []
  for start in listed:
    if start not in found:
      out.append(f'{start} is listed in JAX_FREE but is not a module of the package')
      continue
    chain, queue = {start: [start]}, [start]
    while queue:  # breadth first: the shortest chain to each module
      module = queue.pop(0)
      heavy = sorted(n for n in imports(found[module], module, known, top_level=True,
                                        external=True) if n.split('.')[0] in HEAVY)
      if heavy:
        out.append(f'{start} imports {heavy[0]} at import time: '
                   + ' -> '.join(chain[module]) + f' (import {heavy[0]})')
        break
      for nxt in sorted(edges[module] - set(chain)):
        chain[nxt] = chain[module] + [nxt]
        queue.append(nxt)
  return out


def test_jax_free_modules_import_no_jax_or_tensorflow():
  assert heavy_imports() == []


def test_jax_free_modules_load_no_jax_or_tensorflow():
  """The same, as Python sees it: one process imports the list in order, and the
  first module after which one of HEAVY is loaded is named."""
  code = ('import importlib, sys\n'
          f'for name in {JAX_FREE!r}:\n'
          '  importlib.import_module(name)\n'
          f'  heavy = sorted(h for h in {HEAVY!r} if h in sys.modules)\n'
          '  assert not heavy, f"{name} loads {heavy}"\n')
  root = os.path.dirname(ROOT)
  env = dict(os.environ, PYTHONPATH=root)
  proc = subprocess.run([sys.executable, '-c', code], cwd=root, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize('planted,line,expected', [
    # Directly, in a foundation.
    ('config_keys.py', 'import jax  # noqa',
     ('vmoe_sparse_ot.config_keys imports jax at import time: vmoe_sparse_ot.config_keys '
      '(import jax)',)),
    # Through the package: the pp parser importing the models (Flax).
    ('data/pp_image.py', 'from vmoe_sparse_ot import nn  # noqa',
     ('vmoe_sparse_ot.data.pp imports ', ': vmoe_sparse_ot.data.pp -> '
      'vmoe_sparse_ot.data.pp_image -> vmoe_sparse_ot.nn')),
])
def test_a_planted_heavy_import_is_named(tmp_path, planted, line, expected):
  copy = tmp_path / PACKAGE
  shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns('__pycache__'))
  with open(copy / planted, 'a') as f:
    f.write(f'\n{line}\n')
  found = heavy_imports(str(copy))
  assert any(p.startswith(expected[0]) and all(e in p for e in expected) for p in found), found
  assert heavy_imports() == []  # the package itself is untouched


# Imports of the package's own modules inside functions: each is there for the
# start-up time of a command line, says so in a `# lazy: <reason>` comment (on its
# line or the line above), and there are few of them.
MAX_LAZY = 10
LAZY_MARK = '# lazy:'


def lazy_imports(root: str = ROOT) -> list[tuple[str, int, bool]]:
  """(path relative to `root`, line, marked) of each import of a module of the package
  inside a function; `marked`: a `# lazy:` reason on its line or the line above."""
  found = modules(root)
  known = set(found)
  out = set()
  for module, path in found.items():
    with open(path) as f:
      text = f.read()
    lines = text.splitlines()
    for function in ast.walk(ast.parse(text)):
      if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in _import_nodes(function, top_level=False):
        names = _imported_names(node, module, path.endswith('__init__.py'), known)
        if any(n.split('.')[0] == PACKAGE for n in names):
          marked = any(LAZY_MARK in lines[i - 1] for i in (node.lineno - 1, node.lineno)
                       if i >= 1)
          out.add((os.path.relpath(path, root), node.lineno, marked))
  return sorted(out)


def test_few_lazy_imports_each_with_its_reason():
  found = lazy_imports()
  unmarked = [f'{path}:{line}' for path, line, marked in found if not marked]
  assert not unmarked, f'imports inside functions without a "{LAZY_MARK}" reason: {unmarked}'
  assert len(found) <= MAX_LAZY, (
      f'{len(found)} lazy imports of the package (at most {MAX_LAZY}): '
      + ', '.join(f'{path}:{line}' for path, line, _ in found))


def test_a_planted_lazy_import_is_counted_and_needs_its_reason(tmp_path):
  copy = tmp_path / PACKAGE
  shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns('__pycache__'))
  with open(copy / 'plot.py', 'a') as f:
    f.write('\n\ndef _planted():\n  from vmoe_sparse_ot import errors  # noqa\n'
            '  # lazy: a reason\n  from vmoe_sparse_ot import trees  # noqa\n')
  before, after = lazy_imports(), lazy_imports(str(copy))
  added = sorted(set(after) - set(before))
  assert [(path, marked) for path, _, marked in added] == [('plot.py', False),
                                                             ('plot.py', True)]
