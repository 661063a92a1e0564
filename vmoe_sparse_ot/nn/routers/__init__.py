"""Routers, looked up by name: one module per router, registered here.

Each module defines a frozen options dataclass and a `ROUTER = base.Router(...)`
(see `base` for the contract). Adding a router is one file and one entry in
`ROUTER_MODULES`; `register` adds one from outside the package.

  cfg = parse_router_options(config.model.encoder.moe.router)  # RouterConfig
  router = get_router(cfg.name)
  C = router.capacity(cfg.options, S, E)
  routing = router.route(logits, token_mask, cfg.options, C, train, rng)
  # A stateful router (router.state set, e.g. 'topk_bias') takes its state and
  # also returns the step's statistics:
  routing, stats = router.route(..., state=router.state.init(cfg.options, E))

No gradient flows through an assignment (top-k, Sinkhorn, the OT solver); a
sparse router learns through its combine weights.
"""
import dataclasses
import importlib
from typing import Any, Dict, Mapping, Optional

import jax

from vmoe_sparse_ot.nn.routers import base
from vmoe_sparse_ot.nn.routers.base import Router, RouterState, check_keys

Array = jax.Array
WHERE = "model.encoder.moe.router"
# One line per router module (each defines ROUTER).
ROUTER_MODULES = ("topk", "sbase", "sparse_ot", "expert_choice", "soft_moe", "sinkhorn_ec",
                  "topk_bias", "l2_ot", "kl_ot")
ROUTERS: Dict[str, Router] = {}
DEFAULT_ROUTER = "topk"


def register(router: Router) -> Router:
  """Adds a router; its top-level options must agree with the registered ones' defaults."""
  if router.name in ROUTERS:
    raise ValueError(f"router {router.name!r} is already registered")
  defaults = _top_level_defaults()
  for f in dataclasses.fields(router.options):
    if f.name in base.top_level_fields(router.options) and f.name in defaults and \
        defaults[f.name] != f.default:
      raise ValueError(f"router {router.name!r}: top-level option {f.name!r} defaults to "
                       f"{f.default!r}, others to {defaults[f.name]!r}")
  if router.name in defaults:
    raise ValueError(f"router name {router.name!r} clashes with a top-level option")
  ROUTERS[router.name] = router
  return router


def _top_level_defaults() -> Dict[str, Any]:
  out = {}
  for r in ROUTERS.values():
    for f in dataclasses.fields(r.options):
      if f.name in base.top_level_fields(r.options):
        out[f.name] = f.default
  return out


def _sections() -> Dict[str, tuple]:
  """{router name: its own option names} for routers that have any."""
  return {n: base.section_fields(r.options) for n, r in ROUTERS.items()
          if base.section_fields(r.options)}


@dataclasses.dataclass(frozen=True)
class RouterConfig:
  """A parsed router config: the registered name and its options dataclass."""
  name: str = DEFAULT_ROUTER
  options: Any = None

  def __post_init__(self):
    if self.options is None:
      object.__setattr__(self, "options", ROUTERS[self.name].options())


def get_router(name: str) -> Router:
  if name not in ROUTERS:
    raise ValueError(f"{WHERE}.name must be one of {sorted(ROUTERS)}, got {name!r}")
  return ROUTERS[name]


def parse_router_options(cfg: Mapping[str, Any], where: str = WHERE) -> RouterConfig:
  """Validates a router config dict (see `nn.model_config.default_router_config`).

  Unknown keys anywhere (top level or any router's section) fail; the chosen
  router's values are converted and checked.
  """
  cfg = dict(cfg)
  sections = _sections()
  check_keys(cfg, {"name", *_top_level_defaults(), *sections}, where)
  for name, fields in sections.items():
    check_keys(dict(cfg.get(name) or {}), fields, f"{where}.{name}")
  name = cfg.get("name", DEFAULT_ROUTER)
  if name not in ROUTERS:
    raise ValueError(f"{where}.name must be one of {sorted(ROUTERS)}, got {name!r}")
  _check_exclusive(cfg, name, where)
  router = ROUTERS[name]
  top = {k: v for k, v in cfg.items() if k != "name" and k not in sections}
  options = base.parse_options(router.options, top, dict(cfg.get(name) or {}), where,
                               f"{where}.{name}")
  return RouterConfig(name, options)


def _check_exclusive(cfg: Mapping[str, Any], name: str, where: str) -> None:
  """Refuses another router's `exclusive` options set away from their defaults."""
  for other in ROUTERS.values():
    if other.name == name:
      continue
    top = set(base.top_level_fields(other.options))
    defaults = {f.name: f.default for f in dataclasses.fields(other.options)}
    for field in other.exclusive:
      src, key = ((cfg, f"{where}.{field}") if field in top else
                  (dict(cfg.get(other.name) or {}), f"{where}.{other.name}.{field}"))
      if field in src and src[field] != defaults[field]:
        raise base.OptionError(key, src[field], f"applies to the {other.name} router only "
                               f"({where}.name is {name!r}); leave it at "
                               f"{defaults[field]!r}")


def check_top_level_options(cfg: Mapping[str, Any], where: str = WHERE) -> None:
  """Checks the router config's top-level options whatever router `name` picks.

  Each top-level key (K, C, capacity_factor, noise_std, the loss weights, ...) is
  checked by the first registered router that declares it (`base.check_option`;
  `register` keeps their defaults in agreement). Unknown keys and the chosen
  router's section are left to `parse_router_options`. Raises `base.OptionError`.
  """
  for key, value in cfg.items():
    owner = next((r.options for r in ROUTERS.values()
                  if key in base.top_level_fields(r.options)), None)
    if owner is not None:
      base.check_option(owner, key, value, f"{where}.{key}")


def route(logits: Array, token_mask: Array, cfg: RouterConfig, capacity: int, train: bool,
          rng: Optional[Array] = None, state: Optional[Dict[str, Array]] = None):
  """Routes (G, S, E) logits with the router `cfg` names.

  A stateful router needs `state` and returns (routing, statistics).
  """
  kwargs = {} if state is None else {"state": state}
  return ROUTERS[cfg.name].route(logits, token_mask, cfg.options, capacity, train, rng,
                                 **kwargs)


def default_config() -> Dict[str, Any]:
  """{'name', top-level options..., section: {options}} with every registered default."""
  out: Dict[str, Any] = {"name": DEFAULT_ROUTER, **_top_level_defaults()}
  for name, fields in _sections().items():
    defaults = {f.name: f.default for f in dataclasses.fields(ROUTERS[name].options)}
    out[name] = {k: defaults[k] for k in fields}
  return out


for _module in ROUTER_MODULES:
  register(importlib.import_module(f"{__name__}.{_module}").ROUTER)

__all__ = ["ROUTERS", "ROUTER_MODULES", "Router", "RouterConfig", "RouterState", "check_keys",
           "check_top_level_options",
           "default_config", "get_router", "parse_router_options", "register", "route"]
