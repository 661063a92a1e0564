"""`python -m vmoe_sparse_ot.evaluate --workdir=W ...`: see `vmoe_sparse_ot.evaluate.job`."""
from vmoe_sparse_ot.evaluate import job

if __name__ == '__main__':
  job.run_cli()
