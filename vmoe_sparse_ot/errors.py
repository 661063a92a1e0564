"""User-facing errors: each message is one line that says what to do.

Command lines print `str(error)` for any `TrainerError` and exit non-zero; the
second base class keeps the usual `except` clauses working (a checkpoint that
does not fit the config is a ValueError, a missing one a FileNotFoundError).
`fail` is how every command line reports a user's mistake, and `ArgumentParser`
makes argparse's own mistakes (a misspelt flag, a missing argument) report the
same way.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn


class TrainerError(Exception):
  """Base class: a failure the user can act on, described in one line."""


class NonFiniteLossError(TrainerError, FloatingPointError):
  """Training produced a NaN/Inf loss, gradient or parameter; names the step."""


class ResumeMismatchError(TrainerError, ValueError):
  """The workdir's checkpoint was written with another model, data or optimizer."""


class CheckpointRestoreError(TrainerError, FileNotFoundError):
  """No checkpoint in the folder restores (all are damaged, or none exists)."""


class CheckpointWriteError(TrainerError, OSError):
  """Writing a checkpoint failed (full disk, file-size limit, ...)."""


class CheckpointMismatchError(ValueError):
  """The checkpoint does not fit the model of the config (config keys or parameters)."""


class WorkdirLockedError(TrainerError, RuntimeError):
  """Another trainer holds the workdir."""


def first_line(error: BaseException | str) -> str:
  """The first non-blank line of an error's message (the error's type name if none).

  What every command line prints for a user's mistake: one line, no traceback.
  """
  lines = [line for line in str(error).splitlines() if line.strip()]
  if lines:
    return lines[0]
  return type(error).__name__ if isinstance(error, BaseException) else repr(error)


def fail(prog: str, message: Any, status: int = 2, *, first_line_only: bool = True
         ) -> NoReturn:
  """Prints 'prog: error: message' to stderr (no traceback) and exits with `status`.

  A user's mistake is one line (`first_line_only`); a report that lists several
  differences (a checkpoint that does not match the config) keeps its lines.
  """
  lines = [line for line in str(message).splitlines() if line.strip()]
  text = first_line(message) if first_line_only or not lines else '\n'.join(lines)
  print(f'{prog}: error: {text}', file=sys.stderr, flush=True)
  sys.exit(status)


class ArgumentParser(argparse.ArgumentParser):
  """argparse whose mistakes are one line, 'PROG: error: ...', and exit status 2.

  argparse prints its usage first (several lines for a few flags), which buries
  the line that names the mistake; --help still prints it.
  """

  def error(self, message: str) -> NoReturn:
    fail(self.prog, message)
