r"""Export a checkpoint's parameters to an `.npz` file, for other frameworks.

    python -m vmoe_sparse_ot.export WORKDIR OUT.npz [--step N] [--naming vit|vmoe|ours]

Writes the parameters of checkpoint N (default: the newest that restores) of
WORKDIR under the public ViT files' names (`--naming vit`, the default:
`Transformer/encoderblock_N/MlpBlock_3/...`, MoE layers as
`Transformer/encoderblock_N/Moe/Mlp/Dense_{0,1}/...` with a leading expert axis
and `.../Moe/Router/dense/kernel`), the reference V-MoE code's names
(`--naming vmoe`), or this project's (`--naming ours`); the table is in
`vmoe_sparse_ot.initialization.names`. bfloat16 arrays are written as float32
(numpy's .npz has no bfloat16). The file is written to a temporary name and
renamed into place, so a crash leaves no partial file.

An exported file initializes an identical model: set
`config.initialization.path=OUT.npz` (with the same model config) and the
parameters load bit for bit. A mistake (no checkpoint, an unwritable output) is
one line on stderr and exit status 2.
"""
from __future__ import annotations

import os

from vmoe_sparse_ot import errors
from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot import quiet_logs

quiet_logs.setup_environment()

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np

from vmoe_sparse_ot.initialization import names as names_lib
from vmoe_sparse_ot.initialization import npz as npz_lib
from vmoe_sparse_ot.trees import flatten_tree

PROG = 'python -m vmoe_sparse_ot.export'


def exported_arrays(params, naming: str = 'vit') -> dict[str, np.ndarray]:
  """{name in `naming`: numpy array} of a params tree (bfloat16 widened to float32)."""
  import jax  # lazy: --help and the argument checks answer before JAX loads
  out = {}
  for name, value in flatten_tree(params).items():
    array = np.asarray(jax.device_get(value))
    if array.dtype.name == 'bfloat16':
      array = array.astype(np.float32)
    out[names_lib.from_ours(name, naming)] = array
  return out


def export(workdir: str, out: str, step: int | None = None, naming: str = 'vit') -> tuple[int, int]:
  """Writes the checkpoint's parameters to `out`; returns (step, number of arrays).

  Raises ValueError naming the argument: WORKDIR or --step without a checkpoint
  that restores, OUT that cannot be written.
  """
  from vmoe_sparse_ot import checkpoints  # lazy: as jax above (Orbax loads in seconds)
  try:
    params, _, step = checkpoints.restore_params_with_meta(workdir, step)
  except errors.CheckpointRestoreError as e:
    where = f'WORKDIR {workdir}' if step is None else f'--step={step}'
    raise ValueError(f'{where}: {e}') from None
  arrays = exported_arrays(params, naming)
  try:
    npz_lib.write_npz(out, arrays)
  except OSError as e:  # e.g. a folder the permissions allow but the system refuses (/proc)
    raise ValueError(f'OUT {out}: cannot write it ({e})') from None
  return step, len(arrays)


def main(argv: list[str] | None = None) -> None:
  parser = errors.ArgumentParser(prog=PROG, description=__doc__.split('\n\n')[1])
  parser.add_argument('workdir', help='training workdir holding checkpoints/')
  parser.add_argument('out', help='output .npz file')
  parser.add_argument('--step', type=int, default=None, help='checkpoint step (default: latest)')
  parser.add_argument('--naming', choices=names_lib.NAMINGS, default='vit',
                      help='parameter names to write (default: vit)')
  args = parser.parse_args(argv)
  if not os.path.isdir(os.path.join(args.workdir, workdir_layout.CHECKPOINTS)):
    errors.fail(PROG, f'WORKDIR {args.workdir} has no checkpoints/ directory')
  out_dir = os.path.dirname(os.path.abspath(args.out))
  if os.path.isdir(args.out):
    errors.fail(PROG, f'OUT {args.out}: is a directory; name the .npz file to write')
  if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
    errors.fail(PROG, f'OUT {args.out}: directory {out_dir} does not exist or is not writable')
  quiet_logs.quiet_library_logs()
  try:
    step, count = export(args.workdir, args.out, args.step, args.naming)
  except (OSError, ValueError) as e:
    errors.fail(PROG, ' '.join(str(e).split()))
  print(f'Wrote {count} arrays of step {step} of {args.workdir} to {args.out} '
        f'({args.naming} naming)')


if __name__ == '__main__':
  main()
