"""The options of `solve`'s two ascent methods: one object per method.

`solve(..., solver=LBFGS(history=5))` or `solver=Adam(learning_rate=0.1)`;
the strings "lbfgs" and "adam" mean `LBFGS()` and `Adam()`. A field lives on
the object of the one method that reads it; what both read (max_iter, tol)
stays an argument of `solve`. The objects are NamedTuples (pytrees, hashable
when their fields are), checked by `resolve` before anything compiles.

The flat keywords of earlier versions (`solve(history=5)`, `learning_rate=`)
still work for a deprecation period through `accepts_flat_options`, with a
`DeprecationWarning`, and give the same result as the objects.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import NamedTuple, Optional, Union

from vmoe_sparse_ot.ot import validation


class LBFGS(NamedTuple):
  """L-BFGS ascent (`solve`'s default method) and its stop rules.

  Attributes:
    history: Python int >= 1, the number of curvature pairs kept. It shapes
      the program: each value compiles its own.
    rtol: Python float >= 0, or None. The objective rule: stop once the
      quasi-Newton model predicts at most rtol * |objective| left to gain
      (status "objective_tol"); 0 turns it off. None: 1e-9 in float64, 1e-7
      in float32, but 0 when `solve`'s tol is given (an explicit tol asks for
      the marginals to that tolerance).
    ftol: Python float >= 0 (0: off). Also stop once an iteration gains at
      most ftol * |objective| and the model predicts no more than that is
      left: looser and faster than rtol, less accurate.
    patience: Python int >= 1, how many iterations in a row the ftol test
      must hold before it stops the run.
  """
  history: int = 10
  rtol: Optional[float] = None
  ftol: float = 0.0
  patience: int = 1

  def checked(self) -> LBFGS:
    """These options as Python numbers. Raises ValueError naming a bad field."""
    rtol = None if self.rtol is None else validation.check_nonneg_float("LBFGS.rtol", self.rtol)
    return LBFGS(history=validation.check_int("LBFGS.history", self.history, 1),
                 rtol=rtol, ftol=validation.check_nonneg_float("LBFGS.ftol", self.ftol),
                 patience=validation.check_int("LBFGS.patience", self.patience, 1))


class Adam(NamedTuple):
  """Adam ascent from the potentials, with a fixed step size.

  Attributes:
    learning_rate: positive finite Python float, the step size in the costs'
      units (Adam is not rescaled with extreme costs, unlike L-BFGS).
  """
  learning_rate: float = 1e-2

  def checked(self) -> Adam:
    """These options as Python numbers. Raises ValueError naming a bad field."""
    lr = validation.check_pos_float("Adam.learning_rate", self.learning_rate)
    if not validation.is_concrete(lr):
      raise ValueError("Adam.learning_rate must be a Python float (static), not a traced value")
    return Adam(learning_rate=float(lr))


Solver = Union[LBFGS, Adam]
BY_NAME = {"lbfgs": LBFGS, "adam": Adam}
# The flat keywords of earlier versions, and the object each now lives on.
FLAT_OPTIONS = {"history": LBFGS, "rtol": LBFGS, "ftol": LBFGS, "patience": LBFGS,
                "learning_rate": Adam}


def resolve(solver) -> Solver:
  """The checked options object for `solve`'s `solver` argument.

  Args:
    solver: "lbfgs", "adam" (their default objects), or an `LBFGS` / `Adam`.

  Returns:
    An `LBFGS` or `Adam` whose fields are Python numbers.

  Raises:
    ValueError: an unknown solver, or a field out of range (named).
  """
  if isinstance(solver, (LBFGS, Adam)):
    return solver.checked()
  validation.check_choice("solver", solver, tuple(BY_NAME))
  return BY_NAME[solver]()


def with_flat_options(solver, flat: dict) -> Union[str, Solver]:
  """`solver` with the deprecated flat keywords `flat` folded in.

  A name ("lbfgs", "adam") becomes its object with the flat fields it reads;
  an object given as such keeps its own fields, as it did when both were
  accepted. Every flat value is still checked (ValueError naming it).
  """
  for cls in (LBFGS, Adam):
    own = {k: v for k, v in flat.items() if FLAT_OPTIONS[k] is cls}
    if own:
      cls(**own).checked()
  if isinstance(solver, str) and solver in BY_NAME:
    cls = BY_NAME[solver]
    return cls(**{k: v for k, v in flat.items() if FLAT_OPTIONS[k] is cls})
  return solver


def deprecation_message(fn_name: str, flat: dict) -> str:
  """One line naming the flat keywords and the object they now live on."""
  homes = []
  for cls in (LBFGS, Adam):
    names = ", ".join(f"{k}=..." for k in flat if FLAT_OPTIONS[k] is cls)
    if names:
      homes.append(f"solver=ot.{cls.__name__}({names})")
  given = ", ".join(f"{k}=..." for k in flat)
  return f"{fn_name}({given}) is deprecated: use {' and '.join(homes)}"


def accepts_flat_options(fn):
  """`fn` (whose signature has `solver`) also taking the deprecated flat
  keywords of `FLAT_OPTIONS`: each call that passes some warns once
  (DeprecationWarning) and runs with them folded into `solver`."""
  signature = inspect.signature(fn)
  name = f"ot.{fn.__name__}"

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    flat = {k: kwargs.pop(k) for k in list(kwargs) if k in FLAT_OPTIONS}
    if not flat:
      return fn(*args, **kwargs)
    warnings.warn(deprecation_message(name, flat), DeprecationWarning, stacklevel=2)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    bound.arguments["solver"] = with_flat_options(bound.arguments["solver"], flat)
    return fn(*bound.args, **bound.kwargs)

  return wrapper
