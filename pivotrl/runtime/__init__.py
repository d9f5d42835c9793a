"""The runtimes' shared loop and the real devices (`cluster=local`, `cluster=ray`).

Files (bottom-up):
- `loop.py`: the one runtime loop (events -> controller -> actions -> driver, ticks, refits,
  stall and wall checks) over a `Driver`; the simulator's driver is `pivotrl.sim.runtime`.
- `recorder.py`: metrics rows, timeline events, the summary's common figures, the step line.
- `cluster.py`: start/attach Ray; one placement-group bundle per device (`pivot_device` custom
  resource on local, `GPU` on ray); too few resources is an error naming both numbers.
- `device.py`: one Ray actor per device (thread budget, core pinning), hosting at most one active
  role; a background loop steps its engine; poll/abort/submit/shift/train calls.
- `roles.py`: each role's context in four categories (temporary, parameters, offloadable,
  preserved) and the timed `shift_down` / `shift_up` halves; a replica of several devices is
  hosted by its first device (`EnginePlacement`), the others are members (`MemberHost`).
- `params.py`: `ParamSource`, the GPS (a Ray store on the cluster's nodes) holding the policy and
  the frozen GenRM: trainer ranks write their shards into it, each device reads its own node's
  copy itself; the driver only names versions.
- `executor.py`: scheduler moves and shift plans carried out on the actors; respawn and re-host
  of dead actors (each death recorded once), crash-loop flags, the trainer rebuilt from a
  checkpoint when a rank's state died; measured shift times for the controller. `outcomes.py`:
  what it found out (move and shift results, deaths, training errors: plain data).
- `monitor.py`: per-role workload state and the online throughput-model fit (core's fit).
- `assets.py`: which checkpoints and data a run loads; `evaluation.py`: prompt encoding and
  held-out accuracy of an engine; `validation.py`: that accuracy on a rollout replica of the
  cluster (`RemoteEngine`, `rollout_replica`); `samples.py`: requests, judge prompts, rewards, train batches;
  `ledger.py`: the truth about every sequence (tokens with behaviour log-probs).
- `launch.py`: the devices of a real run (cluster, executor, GPS, resume checkpoint).
- `faults.py`: named fault points of the device loop (test hooks for deterministic kill tests).
- `training.py`: one training step on the home devices (batch, step, publish into GPS, a
  checkpoint written in the background).
- `driver.py`: the real devices' `Driver`; `real.py`: `run_real` (`cluster=local|ray`).
The control plane (core, deploy) is imported, never copied: tests/runtime/test_same_control_plane.py.
"""
