"""The trainer's user-facing errors: each message is one line that says what to do.

Command lines print `str(error)` for any `TrainerError` and exit non-zero; the
second base class keeps the usual `except` clauses working (a checkpoint that
does not fit the config is a ValueError, a missing one a FileNotFoundError).
"""
from __future__ import annotations


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
