"""Command-line side of configs: one-line errors for `--config` and its overrides.

Used by every command line that takes `--config=path.py[:arg]` (main, fewshot, evaluate):
`preflight_config_flag(argv)` loads the config file once before absl parses the
flags, so a missing file or a bad `:key=value` argument is one line instead of
the traceback that `config_flags` embeds; `explain_override` names the valid keys
when a `--config.a.b=v` override has a typo.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, Sequence

from absl import flags as absl_flags

from vmoe_sparse_ot.errors import fail  # noqa: F401  (cli.fail: every job's one line)
from vmoe_sparse_ot.config import reference
from vmoe_sparse_ot.config.files import load_config_file


def explain_override(config: Mapping[str, Any], overrides: Sequence[str]) -> str | None:
  """For '--config.a.b=v' overrides, names the first unknown key and the valid ones."""
  for override in overrides:
    path = override.split('=', 1)[0][len('--config.'):]
    node, walked = config, []
    for part in path.split('.'):
      if not hasattr(node, 'keys') or part not in node.keys():
        where = '.'.join(['config', *walked])
        valid = sorted(node.keys()) if hasattr(node, 'keys') else []
        return (f'Unknown config key {part!r} in {override.split("=", 1)[0]}; valid keys '
                f'under {where}: {", ".join(valid) if valid else "(none: it is a value)"}')
      node = node[part]
      walked.append(part)
  return None


def config_spec(argv: Sequence[str]) -> str | None:
  """The value of --config (or '--config VALUE') in `argv`, if any."""
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      return arg.split('=', 1)[1]
    if arg == '--config' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def preflight_config_flag(prog: str, argv: Sequence[str]) -> None:
  """Loads the --config file (if given) and exits with one line if that fails."""
  spec = config_spec(argv)
  if spec is None:
    return
  try:
    load_config_file(spec, translate=False)
  except (OSError, ValueError, TypeError, SyntaxError, AttributeError, KeyError) as e:
    fail(prog, f'--config={spec}: {type(e).__name__ + ": " if isinstance(e, SyntaxError) else ""}'
         f'{e}')


def parse_flags(prog: str, argv: list[str], flag_values: Any = None) -> list[str]:
  """absl flag parsing where every mistake in --config is one line, exit status 2.

  `flag_values`: the `absl.flags.FlagValues` to parse into (default the global
  `flags.FLAGS`); a job with its own can be called in-process more than once.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  preflight_config_flag(prog, argv)
  try:
    return (flags.FLAGS if flag_values is None else flag_values)(argv)
  except (KeyError, AttributeError, ValueError, TypeError, flags.Error) as e:
    spec = config_spec(argv)
    overrides = [a for a in argv if a.startswith('--config.')]
    message = None
    if spec and overrides:
      try:
        message = explain_override(load_config_file(spec, translate=False), overrides)
      except Exception:  # pylint: disable=broad-except
        message = None
    if message is None:
      # config_flags embeds the config file's traceback; its last line is the cause.
      lines = [line for line in str(e).splitlines() if line.strip()]
      message = lines[-1] if lines else repr(e)
    fail(prog, message)


def print_stdout(text: str) -> None:
  """Prints `text`; a closed pipe (`... --print_config | head`) is not an error."""
  try:
    print(text, flush=True)
  except BrokenPipeError:
    # Python would complain again when it flushes stdout at exit.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def format_config(config: Any) -> str:
  """The resolved config as indented JSON (what --print_config shows)."""
  return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=repr)


class ConfigFileParser(absl_flags.ArgumentParser):
  """Every job's --config parser: `load_config_file` (remote paths too), untranslated, locked.

  Set on a `config_flags.DEFINE_config_file` flag (`FLAGS['config'].parser = ...`):
  it replaces config_flags' own loader (local files only), which still applies the
  `--config.KEY=VALUE` overrides to what this returns; those name the file's own
  keys, so a reference config file is translated after them
  (`config.reference.resolve`).
  """

  def __init__(self, name: str):
    self.name = name

  def parse(self, argument):
    config = reference.with_command_line_keys(load_config_file(argument, translate=False))
    config.lock()
    return config

  def flag_type(self):
    return 'config object'
