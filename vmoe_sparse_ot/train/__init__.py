"""Training: the run, its step and its loop.

Read in this order:
  trainer      `train_and_evaluate`: build the run, restore or initialize, loop, summarize.
  run          `build(config)` -> `Run`: model, mesh, optimizer, shardings, jitted programs.
  step         the train step as a pure function (loss, mixup, microsteps, router state).
  hooks        the periodic actions after a step: checkpoint, evaluate, few-shot.
  run_record   what a checkpoint records about its run, and when it resumes or evaluates.
  evaluation   the one evaluation loop; periodic_eval: the eval step and eval sets.
Beside them: state (TrainState), optimizer (optax optimizers and schedules), losses,
metrics, progress (the console line), compute (FLOPs per step, device-seconds, MFU),
mixup, microsteps, programs (the compiled-program cache of `run`), lock (one trainer per
workdir), profiling.
"""
