"""Elastic training on real devices (DESIGN §4.6): the trainer's state in GPS and its process groups.

Owns `TrainerGroups`, what the launch needs to let the trainer change devices between steps:
- the state store (`trainer.state_store`): registered in the run's GPS at start when
  `deploy.planner.elastic_training` is on. A GPS whose host-memory budget cannot hold it (GPS's
  `BudgetError`, which names the sizes) turns elastic training off for the run, with a warning
  naming the sizes: the trainer then stays on its home set (`off` says why; the controller is
  told). The state is written after every step (`training.TrainingSteps`); once one write is
  done (`ready`), every new trainer group is built from it instead of from the model folder or
  a checkpoint, at whatever world size;
- one process-group rendezvous per trainer group: the same training slot keeps its group (and its
  ranks keep their preserved context, offloaded between steps, as in the paper); a different slot
  (the trainer grown onto borrowed devices, or back on its home set) is a new group with a fresh
  TCP rendezvous (rank 0's node and a port free there, asked by the launch), so the ranks of the
  old group rebuild theirs (`roles.TrainHost`); `reset` forces a fresh one (a group lost with a
  dead device);
- `preserve(slot)`: only the home set's ranks keep their trainer across shifts; a grown group's
  ranks drop theirs when they shift down (its state is in GPS; keeping an offloaded copy on every
  borrowed device would only hold host memory).
`restart_slot` says where a step that lost a rank restarts (`training.TrainingSteps`).
Without elastic training there is no state store, every slot is the home set, and this is the
single rendezvous the trainer always had.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from pivotrl.core.types import Slot

if TYPE_CHECKING:
    from pivotrl.runtime.params import ParamSource
    from pivotrl.trainer.state_store import StateHandle

log = logging.getLogger(__name__)

#: GPS model key of the trainer's state.
STATE_MODEL = "policy.train_state"


def restart_slot(devices: tuple[int, ...], dead: list[int]) -> Slot | None:
    """Where a step that lost the ranks on `dead` restarts: the longest run of consecutive devices
    of `devices` still alive (the later one on a tie: nearer the home set, which ends the slot);
    None when none is left."""
    from pivotrl.core.types import Role

    best: tuple[int, int] | None = None  # (length, first device)
    run: list[int] = []
    for d in list(devices) + [None]:
        if d is not None and d not in dead and (not run or d == run[-1] + 1):
            run.append(d)
            continue
        if run and (best is None or len(run) >= best[0]):
            best = (len(run), run[0])
        run = [d] if d is not None and d not in dead else []
    return None if best is None else Slot(Role.TRAIN, best[1], best[0])


class TrainerGroups:
    """The trainer's rendezvous per training slot and its state store (module docstring)."""

    def __init__(self, home: Slot | None = None) -> None:
        self.home = home
        self.state: StateHandle | None = None
        """`state_store.StateHandle` of the trainer's state in GPS, or None (no elastic training)."""
        self.ready = False
        """Whether GPS holds the trainer's current state (a step wrote it)."""
        self.off: str | None = None
        """Why elastic training was asked for and is off (None: it is on, or was not asked for)."""
        self._slot: Slot | None = None
        self._url: str | None = None

    def register(self, params: ParamSource, policy_path: Path) -> None:
        """Add the trainer's state to GPS (`params.store`), or turn elastic training off saying why."""
        from pivotrl.gps.errors import BudgetError
        from pivotrl.trainer.state_store import StateHandle, register_state

        try:
            nbytes = register_state(params.store, STATE_MODEL, policy_path)
        except BudgetError as e:
            self.off = (f"deploy.planner.elastic_training is on, but the trainer's state (fp32 weights and AdamW "
                        f"moments of {policy_path}) does not fit GPS's host memory: {e}; the trainer stays on its "
                        f"home set")
            log.warning("%s", self.off)
            return
        self.state = StateHandle(params.store, STATE_MODEL)
        log.info("elastic training: the trainer's state (%.1f MB) lives in GPS model %r between steps",
                 nbytes / 1e6, STATE_MODEL)

    def url(self, slot: Slot, fresh: Callable[[int], str]) -> str:
        """The rendezvous of the trainer group on `slot`: the last one if the slot is the same, else
        `fresh(slot.first_device)` (a new address at rank 0's node)."""
        if self._slot != slot or self._url is None:
            self._url = fresh(slot.first_device)
            self._slot = slot
        return self._url

    def reset(self) -> None:
        """The next trainer group gets a fresh rendezvous (its predecessor was lost)."""
        self._url = None
        self._slot = None

    def preserve(self, slot: Slot) -> bool:
        """Whether the ranks of `slot` keep their trainer (offloaded) when they shift down."""
        return self.state is None or self.home is None or slot == self.home

    def holds_version(self, version: int) -> bool:
        """Whether GPS holds the trainer's state at policy `version` (a lost trainer can be
        rebuilt from it without a checkpoint)."""
        if self.state is None or not self.ready:
            return False
        from pivotrl.trainer.state_store import stored_version

        return stored_version(self.state.store, self.state.name) == int(version)
