"""A GPU's energy counter where the card keeps none: its power readings added up (gpubook_agent/gpus/energy.py);
and the simulated cards' counters, which follow their simulated power."""

from __future__ import annotations

import time

from gpubook_agent.gpus import open_backend
from gpubook_agent.gpus.energy import PowerIntegral


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_power_readings_add_up_as_the_trapezoid_between_them():
    clock = Clock()
    integral = PowerIntegral(clock=clock)

    assert integral.add("GPU-a", 100.0) == 0  # the first reading starts the counter
    clock.now += 5
    assert integral.add("GPU-a", 300.0) == 1_000_000  # (100 + 300) / 2 W x 5 s = 1,000 J
    clock.now += 10
    assert integral.add("GPU-a", 300.0) == 4_000_000  # + 300 W x 10 s
    assert integral.add("GPU-b", 50.0) == 0  # each GPU its own counter


def test_a_reset_starts_the_counter_again_from_zero_as_a_driver_reload_does():
    clock = Clock()
    integral = PowerIntegral(clock=clock)
    integral.add("GPU-a", 200.0)
    clock.now += 1
    assert integral.add("GPU-a", 200.0) == 200_000

    integral.reset("GPU-a")
    clock.now += 60
    assert integral.add("GPU-a", 200.0) == 0  # the minute in between is not counted
    clock.now += 1
    assert integral.add("GPU-a", 200.0) == 200_000


def test_simulated_cards_count_their_energy_from_their_power_and_a_reset_starts_over(tmp_path):
    backend = open_backend("simulated", device_dir=str(tmp_path), node_name="gpu-demo", simulated_gpus=1)
    try:
        first = backend.sample()[0]
        time.sleep(0.1)
        second = backend.sample()[0]
        backend.reset_energy(second.uuid)
        after_reset = backend.sample()[0]
    finally:
        backend.close()

    assert (first.energy_mj, first.energy_estimated) == (0, False)  # the card's own counter: measured
    # Idle power (first.power_w W) for at least 0.1 s; far less than a second of it, whatever the machine.
    assert first.power_w * 0.1 * 1000 <= second.energy_mj < first.power_w * 10 * 1000
    assert after_reset.energy_mj == 0
    assert "energy_mj" not in second.missing
