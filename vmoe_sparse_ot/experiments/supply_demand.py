"""Supply-demand transport on the sphere (paper appendix "Supply-demand
transportation on spherical data", after Amos et al. 2022, "Meta optimal transport").

100 supply and 10,000 demand locations on the Earth, transport cost = great-circle
distance. Two plans: entropic OT (every supplier serves every location a little)
and sparsity-constrained OT where each supplier serves at most k = 100 demand
locations (a supplying capacity).

Locations (nothing is downloaded): the population data of Amos et al. are not
shipped with any installed package, so demand is drawn from a mixture of
von Mises-Fisher blobs centred on `CENTRES`, 24 large metropolitan areas,
weighted by their (rounded) population and tight (kappa = 150, about 520 km);
supply from the same centres with equal weights and wider blobs (kappa = 25,
about 1,270 km), so that populous regions must import from elsewhere. Every
demand location needs one unit, every supplier holds m / n units.

Orientation: the library bounds nonzeros per column, so the problem is solved
with demand locations as rows and suppliers as columns (C is (m demand, n
supply)); "at most k locations per supplier" is then "at most k nonzeros per
column". Costs are in units of 1,000 km; `GAMMA` (squared-2-norm strength of the
sparsity-constrained plan) and `EPSILON` (entropic) are in the same units.
The map is longitude/latitude (equirectangular) without coastlines: no installed
package ships coastline data.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from matplotlib.collections import LineCollection
import numpy as np

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.experiments import common
from vmoe_sparse_ot.experiments import style

NAME = 'supply_demand'
EARTH_RADIUS_KM = 6371.0
# (name, longitude, latitude, population in millions, rounded).
CENTRES = (
    ('Tokyo', 139.7, 35.7, 37), ('Delhi', 77.2, 28.6, 31), ('Shanghai', 121.5, 31.2, 27),
    ('Sao Paulo', -46.6, -23.6, 22), ('Mexico City', -99.1, 19.4, 22),
    ('Cairo', 31.2, 30.0, 21), ('Mumbai', 72.9, 19.1, 20), ('Beijing', 116.4, 39.9, 20),
    ('Dhaka', 90.4, 23.8, 21), ('Osaka', 135.5, 34.7, 19), ('New York', -74.0, 40.7, 19),
    ('Karachi', 67.0, 24.9, 16), ('Buenos Aires', -58.4, -34.6, 15),
    ('Istanbul', 29.0, 41.0, 15), ('Lagos', 3.4, 6.5, 14), ('Manila', 121.0, 14.6, 14),
    ('Moscow', 37.6, 55.8, 12), ('Los Angeles', -118.2, 34.1, 12),
    ('Paris', 2.35, 48.9, 11), ('London', -0.1, 51.5, 9), ('Jakarta', 106.8, -6.2, 11),
    ('Kinshasa', 15.3, -4.3, 14), ('Sydney', 151.2, -33.9, 5), ('Chicago', -87.6, 41.9, 9),
)
DEMAND_KAPPA = 150.0
SUPPLY_KAPPA = 25.0
K = 100
GAMMA = 1.0
EPSILON = 0.5
FULL = {'num_supply': 100, 'num_demand': 10_000, 'k': K, 'max_iter': 1000}
QUICK = {'num_supply': 12, 'num_demand': 300, 'k': 40, 'max_iter': 300}
TOL = 1e-3  # Largest marginal violation, in demand units.
WEIGHT_FLOOR = 0.05  # Entropic map: edges carrying >= 5% of a location's demand.


def lonlat_to_xyz(lon, lat):
  lon, lat = np.radians(lon), np.radians(lat)
  return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1)


def xyz_to_lonlat(xyz):
  xyz = xyz / np.linalg.norm(xyz, axis=-1, keepdims=True)
  return np.degrees(np.arctan2(xyz[..., 1], xyz[..., 0])), np.degrees(
      np.arcsin(np.clip(xyz[..., 2], -1.0, 1.0)))


def sample_vmf(rng: np.random.Generator, mean: np.ndarray, kappa: float, num: int):
  """`num` unit vectors from the von Mises-Fisher law on S^2 (exact 3-D sampler)."""
  u = rng.uniform(size=num)
  # Inverse CDF of w = <x, mean> on S^2: density proportional to exp(kappa w).
  w = 1.0 + np.log(u + (1.0 - u) * np.exp(-2.0 * kappa)) / kappa
  theta = rng.uniform(0.0, 2.0 * np.pi, size=num)
  # Orthonormal basis of the tangent plane at `mean`.
  helper = np.array([1.0, 0.0, 0.0]) if abs(mean[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
  e1 = np.cross(mean, helper)
  e1 /= np.linalg.norm(e1)
  e2 = np.cross(mean, e1)
  r = np.sqrt(np.clip(1.0 - w * w, 0.0, None))
  return (w[:, None] * mean + r[:, None] * (np.cos(theta)[:, None] * e1
                                            + np.sin(theta)[:, None] * e2))


def sample_locations(rng: np.random.Generator, num: int, kappa: float, weighted: bool):
  """`num` points (unit vectors (num, 3)) from the mixture of blobs on `CENTRES`."""
  weights = np.array([c[3] for c in CENTRES], np.float64) if weighted else np.ones(len(CENTRES))
  counts = rng.multinomial(num, weights / weights.sum())
  means = lonlat_to_xyz(np.array([c[1] for c in CENTRES]), np.array([c[2] for c in CENTRES]))
  points = [sample_vmf(rng, mean, kappa, c) for mean, c in zip(means, counts) if c]
  return np.concatenate(points)


def great_circle_km(p, q):
  """(len(p), len(q)) great-circle distances in km between unit vectors p, q."""
  return EARTH_RADIUS_KM * np.arccos(np.clip(p @ q.T, -1.0, 1.0))


def solve_plans(demand_xyz, supply_xyz, k: int, max_iter: int):
  """Entropic and sparsity-constrained plans (m demand, n supply) and diagnostics."""
  m, n = len(demand_xyz), len(supply_xyz)
  C = jnp.asarray(great_circle_km(demand_xyz, supply_xyz) / 1000.0, jnp.float32)
  a = jnp.ones((m,), jnp.float32)  # One unit per demand location.
  b = jnp.full((n,), m / n, jnp.float32)  # Equal stocks at the suppliers.
  start = time.perf_counter()
  ent = ot.sinkhorn(a, b, C, EPSILON, max_iter=max_iter, tol=TOL)
  ent_plan = np.asarray(ent.plan)
  ent_s = time.perf_counter() - start
  start = time.perf_counter()
  # ot.solve's tol is relative to the total mass sum(a) = m; TOL is in demand
  # units (Sinkhorn's tol is absolute). The semi-dual in float64: with one unit
  # per location float32 stops at its rounding floor, short of TOL (see
  # `ot.solve`'s known limit).
  with jax.enable_x64(True):
    f64 = jnp.float64
    sparse = ot.solve(a.astype(f64), b.astype(f64), C.astype(f64),
                      ot.SparsityConstrained(k=k, gamma=GAMMA), formulation='semi_dual',
                      solver='lbfgs', max_iter=max_iter, tol=TOL / m)
    sparse_plan = np.asarray(sparse.plan)
  sparse_s = time.perf_counter() - start
  C = np.asarray(C, np.float64)

  def summary(plan, seconds, num_iter):
    nnz_per_supplier = np.sum(plan > 0, axis=0)
    return {
        'nonzeros': int(np.sum(plan > 0)),
        'max_nonzeros_per_supplier': int(nnz_per_supplier.max()),
        'mean_suppliers_per_location': float(np.mean(np.sum(plan > 0, axis=1))),
        # The semi-dual meets the column (supply) marginals exactly but the row
        # ones only approximately when k binds (the optimum sits on a kink).
        'locations_below_half_served': int(np.sum(plan.sum(1) < 0.5)),
        'mean_cost_km': float(1000.0 * np.sum(plan * C) / m),
        'row_marginal_error': float(np.max(np.abs(plan.sum(1) - 1.0))),
        'column_marginal_error': float(np.max(np.abs(plan.sum(0) - m / n))),
        'solver_iterations': int(num_iter),
        'seconds': seconds,
    }

  return ent_plan, sparse_plan, C, {
      'entropic': summary(ent_plan, ent_s, ent.num_iter),
      'sparsity_constrained': summary(sparse_plan, sparse_s, sparse.num_iter),
  }


def run(out_dir: str, *, quick: bool, seeds: int | None) -> dict:
  """Draws the locations (seed 0), solves both plans, draws both maps."""
  del seeds  # One draw of locations, as in the paper's figure.
  settings = QUICK if quick else FULL
  rng = np.random.default_rng(0)
  demand = sample_locations(rng, settings['num_demand'], DEMAND_KAPPA, weighted=True)
  supply = sample_locations(rng, settings['num_supply'], SUPPLY_KAPPA, weighted=False)
  ent, sparse, _, stats = solve_plans(demand, supply, settings['k'], settings['max_iter'])
  payload = {
      'settings': dict(settings, gamma=GAMMA, epsilon=EPSILON, tol=TOL,
                       demand_kappa=DEMAND_KAPPA, supply_kappa=SUPPLY_KAPPA,
                       cost_units='1000 km', orientation='rows: demand, columns: supply'),
      'plans': stats,
  }
  plot(demand, supply, ent, sparse, settings['k'], f'{out_dir}/{NAME}.png')
  payload['figure_edges'] = {'entropic_weight_floor': WEIGHT_FLOOR}
  return payload


def _edge_segments(demand, supply, plan, floor: float, num_points: int = 12):
  """Great-circle polylines for plan entries >= floor, cut where they cross +-180 deg.

  Returns (segments (s, 2, 2) lon/lat, weights (s,)) sorted light to heavy.
  """
  rows, cols = np.nonzero(plan >= floor)
  weights = plan[rows, cols]
  order = np.argsort(weights)
  rows, cols, weights = rows[order], cols[order], weights[order]
  p, q = supply[cols], demand[rows]
  omega = np.arccos(np.clip(np.sum(p * q, -1), -1.0, 1.0))[:, None, None]
  s = np.linspace(0.0, 1.0, num_points)[None, :, None]
  sin_omega = np.maximum(np.sin(omega), 1e-9)
  path = (np.sin((1 - s) * omega) * p[:, None] + np.sin(s * omega) * q[:, None]) / sin_omega
  lon, lat = xyz_to_lonlat(path)
  segs = np.stack([np.stack([lon[:, :-1], lat[:, :-1]], -1),
                   np.stack([lon[:, 1:], lat[:, 1:]], -1)], axis=2)  # (E, P-1, 2, 2)
  keep = np.abs(segs[..., 0, 0] - segs[..., 1, 0]) < 180.0
  w = np.broadcast_to(weights[:, None], keep.shape)
  return segs[keep], w[keep]


def plot(demand, supply, ent, sparse, k: int, path: str) -> None:
  """Two longitude/latitude maps: entropic plan (a), sparsity-constrained plan (b)."""
  fig, axes = style.figure(2, 1, width=10, height=10.5)
  d_lon, d_lat = xyz_to_lonlat(demand)
  s_lon, s_lat = xyz_to_lonlat(supply)
  panels = [
      (ent, WEIGHT_FLOOR, f'(a) Entropy-regularized plan (epsilon = {EPSILON:g} x 1000 km): '
       f'{int(np.sum(ent > 0)):,} nonzeros; lines with >= {WEIGHT_FLOOR:.0%} of a '
       "location's demand"),
      (sparse, 1e-12, f'(b) Sparsity-constrained plan, at most k = {k} locations per supplier'
       f' (gamma = {GAMMA:g}): {int(np.sum(sparse > 0)):,} nonzeros, max '
       f'{int(np.sum(sparse > 0, axis=0).max())} per supplier'),
  ]
  for ax, (plan, floor, title) in zip(axes[:, 0], panels):
    segs, w = _edge_segments(demand, supply, plan, floor)
    colors = np.zeros((len(w), 4))
    colors[:, :3] = (0.12, 0.35, 0.75)
    colors[:, 3] = 0.03 + 0.3 * w / max(w.max(), 1e-12)
    ax.add_collection(LineCollection(segs, colors=colors, linewidths=0.4, zorder=1))
    ax.scatter(d_lon, d_lat, s=float(np.clip(1e4 / len(d_lon), 1.0, 6.0)), c='#4e79a7', alpha=0.6, zorder=2, linewidths=0,
               label='demand')
    ax.scatter(s_lon, s_lat, s=22, c='#edc948', edgecolors='black', linewidths=0.5,
               zorder=3, label='supply')
    ax.set_xlim(-180, 180)
    ax.set_ylim(-90, 90)
    ax.set_aspect('equal')
    ax.set_xticks(np.arange(-180, 181, 60))
    ax.set_yticks(np.arange(-90, 91, 30))
    ax.set_xlabel('longitude (deg)')
    ax.set_ylabel('latitude (deg)')
    ax.set_title(title, loc='left')
    for side in ('top', 'right'):
      ax.spines[side].set_visible(True)
  axes[0, 0].legend(loc='lower left', markerscale=2)
  fig.suptitle(f'Supply-demand transport on the sphere: {len(supply)} suppliers, '
               f'{len(demand):,} demand locations, great-circle costs (no coastlines)')
  style.save(fig, path)


def format_table(payload: dict) -> str:
  """Nonzeros, per-supplier maxima, mean cost and marginal errors of both plans."""
  rows = [['plan', 'nonzeros', 'max per supplier', 'suppliers per location', '<50% served',
           'mean cost (km)', 'row err', 'col err', 'iters', 'seconds']]
  for name, s in payload['plans'].items():
    rows.append([name, f"{s['nonzeros']:,}", s['max_nonzeros_per_supplier'],
                 f"{s['mean_suppliers_per_location']:.2f}", s['locations_below_half_served'],
                 f"{s['mean_cost_km']:.0f}",
                 f"{s['row_marginal_error']:.1e}", f"{s['column_marginal_error']:.1e}",
                 s['solver_iterations'], f"{s['seconds']:.1f}"])
  st = payload['settings']
  return common.format_rows(rows, f"supply-demand: {st['num_supply']} suppliers, "
                                  f"{st['num_demand']} demand locations, k={st['k']}")
