"""The real runtimes (`cluster=local`, `cluster=ray`): device actors, role shifting, executor, monitor.

Files (bottom-up):
- `cluster.py`: start/attach Ray; one placement-group bundle per device (`pivot_device` custom
  resource on local, `GPU` on ray); too few resources is an error naming both numbers.
- `device.py`: one Ray actor per device (thread budget, core pinning), hosting at most one active
  role; a background loop steps its engine; poll/abort/submit/shift/train calls.
- `roles.py`: each role's context in four categories (temporary, parameters, offloadable,
  preserved) and the timed `shift_down` / `shift_up` halves.
- `executor.py`: scheduler moves and shift plans carried out on the actors; GPS-backed parameter
  reads; respawn of dead actors; measured shifts feed `tau_shift`.
- `monitor.py`: per-role workload state and the online throughput-model fit (core's fit).
- `local_setup.py` + `local.py`: the driver loop that feeds the deployment controllers real events
  (`run_local`); `ray_cluster.py`: the same loop on GPUs (`run_ray`).
The control plane (core, deploy) is imported, never copied: tests/runtime/test_same_control_plane.py.
"""
