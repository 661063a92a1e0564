"""The package's layers (docs/ARCHITECTURE.md, "Layers"), read from its imports.

Every `import` of a module of the package, at the top of a file or inside a
function, read with `ast` (nothing is imported): no module imports one of a
higher layer, and no imports close a circle, between packages or between modules.
"""
import ast
import os
import shutil

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


def imports(path: str, module: str, known: set[str]) -> set[str]:
  """The package's modules that `module` (at `path`) imports, anywhere in the file."""
  with open(path) as f:
    tree = ast.parse(f.read())
  is_package = path.endswith('__init__.py')
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:  # relative: resolve against this module's package
        parts = module.split('.')
        parts = parts if is_package else parts[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = '.'.join(parts + ([base] if base else []))
      # `from pkg import sub` imports the submodule when there is one.
      names = [f'{base}.{a.name}' if f'{base}.{a.name}' in known else base
               for a in node.names]
    else:
      continue
    out.update(n for n in names if n.split('.')[0] == PACKAGE and n != module)
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
