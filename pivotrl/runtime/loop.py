"""The one runtime loop: events from a `Driver` into a deployment controller, the controller's
actions back to the driver, monitor ticks, throughput refits, and the stall and wall checks.

Every runtime runs this loop. A `Driver` is what differs: the simulator's (`pivotrl.sim.runtime`,
a discrete-event clock over modelled replicas) or the real devices' (`pivotrl.runtime.driver`,
Ray actors running real engines and trainers; `cluster=local` and `cluster=ray` differ only in
how those devices are launched). The loop is the only place that calls `Controller.handle`, so
the controller never sees two events at once, and the only place that maps actions to driver
calls.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role
from pivotrl.deploy.events import (
    Dispatch, Event, Finish, Progress, PublishWeights, Record, Start, StartShift, StartTraining, StepDone, Tick,
)

if TYPE_CHECKING:
    from pivotrl.deploy.base import Controller
    from pivotrl.runtime.recorder import Recorder


class Driver(Protocol):
    """What the loop needs from a runtime (see the module docstring)."""

    name: str
    """Shown in errors: `simulation`, `local run`."""
    wall_limit: tuple[str, float] | None
    """(config path, seconds of the driver's clock) after which the run fails; None: no limit."""
    fit_every_s: float | None
    """Refit the throughput models this often (driver clock); None: never."""

    @property
    def now(self) -> float:
        """The driver's clock, seconds since the run began (simulated or wall)."""
    def wait(self) -> Iterable[Event]:
        """The next events, in the order they happened (may be none: nothing happened yet).
        Blocks at most briefly on real devices; advances the clock in the simulator. May be a
        generator: the loop handles each event before the next is produced."""
    def schedule_tick(self, at: float) -> None:
        """A `Tick` is due at `at`: `wait` returns it (with the engines' progress) then."""
    def idle(self) -> bool:
        """Nothing is in flight, so no event can ever come (the run has stalled)."""
    def dispatch(self, act: Dispatch) -> None: ...
    def start_shift(self, act: StartShift) -> None: ...
    def start_training(self, act: StartTraining) -> None: ...
    def publish(self, act: PublishWeights) -> None: ...
    def record(self, act: Record) -> None:
        """A controller record (also written to the timeline by the recorder)."""
    def refit(self) -> dict[Role, tuple[ThroughputModel, int]]:
        """(model, samples it was fitted on) per role, fitted from the engines now (roles without
        enough samples left out)."""
    def step_fields(self, act: StepDone, now: float) -> dict[str, Any]:
        """The driver's own fields of a step's metrics row."""
    def after_event(self) -> None:
        """Called after each event's actions were carried out."""
    def finish(self) -> dict[str, Any]:
        """End of run (threads joined): the driver's own summary fields."""


class RunLoop:
    """Drive `ctrl` with `driver`; `recorder` writes the metrics rows, timeline and summary."""

    def __init__(self, ctrl: Controller, driver: Driver, recorder: Recorder) -> None:
        self.ctrl, self.driver, self.rec = ctrl, driver, recorder
        self.done = False
        self.control_s = 0.0  # wall seconds inside the controller (scheduling and planning)

    def run(self) -> dict[str, Any]:
        d, tick_s = self.driver, self.ctrl.tick_s
        self.handle(Start(d.now))
        if tick_s:
            d.schedule_tick(d.now + tick_s)
        next_fit = d.now + d.fit_every_s if d.fit_every_s else None
        while not self.done:
            self._check_wall()
            n = 0
            for ev in d.wait():
                n += 1
                self.handle(ev)
                if isinstance(ev, Tick) and not self.done:
                    d.schedule_tick(d.now + tick_s)
                if self.done:
                    break
            if self.done:
                break
            if next_fit is not None and d.now >= next_fit:
                self._refit()
                next_fit = d.now + d.fit_every_s
            if not n and d.idle():
                raise RuntimeError(f"{d.name} stalled at step {self.ctrl.step}/{self.rec.steps}: no work in "
                                   f"flight (state {self.ctrl.state()})")
        return self.rec.summary(d.now, d.finish())

    def handle(self, ev: Event) -> None:
        """One event into the controller; its actions to the driver, in order."""
        t0 = time.perf_counter()
        acts = self.ctrl.handle(ev)
        self.control_s += time.perf_counter() - t0
        d = self.driver
        for act in acts:
            if isinstance(act, Dispatch):
                d.dispatch(act)
            elif isinstance(act, StartShift):
                d.start_shift(act)
            elif isinstance(act, StartTraining):
                d.start_training(act)
            elif isinstance(act, PublishWeights):
                d.publish(act)
            elif isinstance(act, Record):
                d.record(act)
                self.rec.event(act.kind, act.fields)
            elif isinstance(act, StepDone):
                fields = d.step_fields(act, d.now)
                fields["control_s"] = self.control_s  # cumulative wall seconds in the controller
                self.rec.step(act, d.now, fields)
            elif isinstance(act, Finish):
                self.done = True
            else:
                raise TypeError(f"{d.name} cannot carry out {type(act).__name__}")
            if self.done:
                break
        d.after_event()

    def _refit(self) -> None:
        for role, (m, n) in self.driver.refit().items():
            self.ctrl.set_throughput_model(role, m)
            self.rec.event("throughput_fit", {"now": self.driver.now, "role": role.value, "A": m.A, "B": m.B,
                                              "C": m.C, "D": m.D, "P0": m.P0, "P1": m.P1, "P2": m.P2,
                                              "samples": n})

    def _check_wall(self) -> None:
        lim = self.driver.wall_limit
        if lim is not None and self.driver.now > lim[1]:
            raise RuntimeError(f"{self.driver.name} passed {lim[0]}={lim[1]}s at step {self.ctrl.step}/"
                               f"{self.rec.steps} (state {self.ctrl.state()})")


__all__ = ["Driver", "Progress", "RunLoop"]
