"""GPU presets for the simulated box: what real drivers report for a few boards people rent.

Values follow what real captures of these boards show (limits, clocks, which fields a consumer
card leaves [N/A], the MIG layout); identifiers (UUIDs, serials) are made up. A preset is plain
data: a driver version and one gpus.json record per GPU, keyed by nvidia-smi field names.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

NOT_SUPPORTED: dict[str, str] = {"error": "Not Supported"}
"""A value nvidia-smi prints as [Not Supported]."""
DEPRECATED: dict[str, str] = {"error": "Requested functionality has been deprecated"}
"""What drivers 55x+ print for display_mode, power.management and application clocks."""

GPU_IDLE = 0x1
ALL_REASONS = 0x1FF
"""clocks_event_reasons.supported on every board captured."""


@dataclass
class Preset:
    """A box's GPUs: the driver it runs and one field record per GPU."""

    name: str
    driver_version: str
    cuda_version: str
    gpus: list[dict[str, Any]] = field(default_factory=list)

    def copy(self) -> Preset:
        return copy.deepcopy(self)


def _uuid(kind: str, n: int) -> str:
    return f"{kind}-5eed{n:04x}-0000-4000-8000-{0x5151 + n:012x}"


def _datacenter(index: int, *, name: str, bus: str, device_id: str, sub_id: str,
                mem_total: int, mem_reserved: int, sm_max: int, mem_clock: int,
                power_limit: float, power_min: float, module_id: int) -> dict[str, Any]:
    """An idle SXM board as a 59x driver reports it (H100/H200 captures)."""
    return {
        "name": name,
        "serial": f"16521230{17 + index:05d}",
        "uuid": _uuid("GPU", index),
        "pci.bus_id": f"00000000:{bus}:00.0",
        "pci.domain": "0x0000", "pci.bus": "0x" + bus, "pci.device": "0x00",
        "pci.baseClass": "0x3", "pci.subClass": "0x2",
        "pci.device_id": device_id, "pci.sub_device_id": sub_id,
        "pcie.link.gen.current": 5, "pcie.link.gen.gpucurrent": 5, "pcie.link.gen.max": 5,
        "pcie.link.gen.gpumax": 5, "pcie.link.gen.hostmax": 5,
        "pcie.link.width.current": 16, "pcie.link.width.max": 16,
        "display_mode": DEPRECATED, "display_attached": True, "display_active": False,
        "persistence_mode": True, "addressing_mode": "None", "accounting.mode": False,
        "accounting.buffer_size": 4000, "vbios_version": "96.00.A5.00.01",
        "inforom.img": "G520.0200.00.05", "inforom.oem": "2.1", "inforom.ecc": "7.16",
        "inforom.checksum_validation": "valid", "gpu_recovery_action": "None",
        "fan.speed": None, "pstate": "P0",
        "clocks_event_reasons.supported": ALL_REASONS,
        "clocks_event_reasons.active": GPU_IDLE,
        **{"clocks_event_reasons_counters." + r: 0 for r in (
            "sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
            "hw_power_brake_slowdown")},
        "memory.total": mem_total, "memory.reserved": mem_reserved, "memory.used": 0,
        "memory.free": mem_total - mem_reserved,
        "compute_mode": "Default", "compute_cap": "9.0",
        "utilization.gpu": 0, "utilization.memory": 0, "utilization.encoder": 0,
        "utilization.decoder": 0, "utilization.jpeg": 0, "utilization.ofa": 0,
        "encoder.stats.sessionCount": 0, "encoder.stats.averageFps": 0,
        "encoder.stats.averageLatency": 0,
        "ecc.mode.current": True, "ecc.mode.pending": True,
        "ecc.errors.corrected.volatile.total": 0, "ecc.errors.uncorrected.volatile.total": 0,
        "ecc.errors.corrected.aggregate.total": 0, "ecc.errors.uncorrected.aggregate.total": 0,
        "remapped_rows.correctable": 0, "remapped_rows.uncorrectable": 0,
        "remapped_rows.pending": False, "remapped_rows.failure": False,
        "temperature.gpu": 31, "temperature.gpu.tlimit": 56, "temperature.memory": 29,
        "power.management": DEPRECATED,
        "power.draw": 72.41, "power.draw.average": 72.41, "power.draw.instant": 72.93,
        "power.limit": power_limit, "enforced.power.limit": power_limit,
        "power.default_limit": power_limit, "power.min_limit": power_min,
        "power.max_limit": power_limit,
        "edpp_multiplier": 100.0,
        "clocks.current.graphics": 345, "clocks.current.sm": 345,
        "clocks.current.memory": mem_clock, "clocks.current.video": 765,
        "clocks.applications.graphics": DEPRECATED, "clocks.applications.memory": DEPRECATED,
        "clocks.default_applications.graphics": DEPRECATED,
        "clocks.default_applications.memory": DEPRECATED,
        "clocks.max.graphics": sm_max, "clocks.max.sm": sm_max, "clocks.max.memory": mem_clock,
        "mig.mode.current": False, "mig.mode.pending": False,
        "gsp.mode.current": True, "gsp.mode.default": True, "c2c.mode": False,
        "protected_memory.total": 0, "protected_memory.used": 0, "protected_memory.free": 0,
        "fabric.state": "Completed", "fabric.status": "Success", "fabric.cliqueId": 0,
        "fabric.clusterUuid": "00000000-0000-0000-0000-000000000000",
        "platform.chassis_serial_number": "", "platform.slot_number": 0,
        "platform.tray_index": 0, "platform.host_id": 1, "platform.peer_type": "Direct Connected",
        "platform.module_id": module_id, "platform.gpu_fabric_guid": 0,
    }


# An HGX H100 board's eight GPUs sit on these buses (typical of 8-GPU SXM boxes).
HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def h100_sxm(count: int = 8, driver: str = "590.48.01") -> Preset:
    """count x NVIDIA H100 80GB HBM3 (SXM, 700 W), idle."""
    gpus = [
        _datacenter(i, name="NVIDIA H100 80GB HBM3", bus=HGX_BUSES[i % 8],
                    device_id="0x233010DE", sub_id="0x16C110DE", mem_total=81559,
                    mem_reserved=479, sm_max=1980, mem_clock=2619, power_limit=700.0,
                    power_min=200.0, module_id=i + 1)
        for i in range(count)
    ]
    return Preset("8x H100 80GB HBM3" if count == 8 else f"{count}x H100", driver, "13.1",
                  gpus)


MIG_H100 = (  # profile, GI, SMs, memory and BAR1 MiB, CE/DEC/JPG: the exporter's H100 capture
    ("3g.40gb", 2, 60, 40448, 24739, 3), ("2g.20gb", 3, 32, 20096, 12369, 2),
    ("1g.10gb", 9, 16, 9984, 6184, 1), ("1g.10gb", 10, 16, 9984, 6184, 1))


def h100_mig(driver: str = "590.48.01") -> Preset:
    """One H100 split into MIG instances 3g.40gb + 2g.20gb + 2x 1g.10gb.

    With MIG on, the driver reports no whole-GPU utilization ([N/A]); compute apps still name
    the parent GPU's UUID; the table's MIG devices block gives each instance's memory and SMs
    and its Processes block each process's instance (all as the captures show).
    """
    gpu = _datacenter(0, name="NVIDIA H100 80GB HBM3", bus="18", device_id="0x233010DE",
                      sub_id="0x16C110DE", mem_total=81559, mem_reserved=479, sm_max=1980,
                      mem_clock=2619, power_limit=700.0, power_min=200.0, module_id=1)
    gpu.update({
        "mig.mode.current": True, "mig.mode.pending": True,
        "utilization.gpu": None, "utilization.memory": None, "utilization.encoder": None,
        "utilization.decoder": None, "utilization.jpeg": None, "utilization.ofa": None,
        "mig_devices": [
            {"profile": p, "uuid": _uuid("MIG", j), "gi": gi, "ci": 0, "dev": j, "sm": sm,
             "mem_used": 9 if j > 1 else 17, "mem_total": mem, "bar1_used": 0,
             "bar1_total": bar1, "ce": engines, "dec": engines, "jpg": engines}
            for j, (p, gi, sm, mem, bar1, engines) in enumerate(MIG_H100)
        ],
    })
    return Preset("H100 with MIG", driver, "13.1", [gpu])


def _rtx_2080_super(driver: str) -> dict[str, Any]:
    """A GeForce RTX 2080 SUPER, idle: no ECC, no serial, no MIG, no memory temperature."""
    return {
        "name": "NVIDIA GeForce RTX 2080 SUPER", "serial": None, "uuid": _uuid("GPU", 0x2080),
        "pci.bus_id": "00000000:0C:00.0", "pci.domain": "0x0000", "pci.bus": "0x0C",
        "pci.device": "0x00", "pci.baseClass": "0x3", "pci.subClass": "0x0",
        "pci.device_id": "0x1E8110DE", "pci.sub_device_id": "0x40051458",
        "pcie.link.gen.current": 1, "pcie.link.gen.max": 3, "pcie.link.width.current": 16,
        "pcie.link.width.max": 16,
        "display_mode": True, "display_active": True, "persistence_mode": False,
        "accounting.mode": False, "accounting.buffer_size": 4000,
        "vbios_version": "90.04.7A.40.73", "inforom.img": "G001.0000.02.04", "inforom.oem": "1.1",
        "fan.speed": 38, "pstate": "P8",
        "clocks_event_reasons.supported": ALL_REASONS, "clocks_event_reasons.active": GPU_IDLE,
        "memory.total": 8192, "memory.reserved": 408, "memory.used": 344, "memory.free": 7440,
        "compute_mode": "Default", "compute_cap": "7.5",
        "utilization.gpu": 0, "utilization.memory": 10,
        "encoder.stats.sessionCount": 0, "encoder.stats.averageFps": 0,
        "encoder.stats.averageLatency": 0,
        "temperature.gpu": 32, "temperature.memory": None, "power.management": True,
        "power.draw": 30.37, "power.limit": 250.0, "enforced.power.limit": 250.0,
        "power.default_limit": 250.0, "power.min_limit": 105.0, "power.max_limit": 350.0,
        "clocks.current.graphics": 300, "clocks.current.sm": 300, "clocks.current.memory": 405,
        "clocks.current.video": 540, "clocks.max.graphics": 2145, "clocks.max.sm": 2145,
        "clocks.max.memory": 7751,
    }


def rtx_2080_super(driver: str = "595.71.05") -> Preset:
    """A consumer card on a current driver: the ECC, MIG, serial fields are [N/A]."""
    gpu = _rtx_2080_super(driver)
    gpu.update({"display_mode": DEPRECATED, "power.management": DEPRECATED,
                "kmd_version": driver, "addressing_mode": "HMM", "display_attached": True,
                "gsp.mode.current": True, "gsp.mode.default": True,
                "clocks.applications.graphics": DEPRECATED,
                "clocks.applications.memory": DEPRECATED,
                "clocks.default_applications.graphics": DEPRECATED,
                "clocks.default_applications.memory": DEPRECATED})
    return Preset("RTX 2080 SUPER", driver, "13.2", [gpu])


def old_driver(driver: str = "465.27") -> Preset:
    """The same card on a 2021 driver: only clocks_throttle_reasons.* names are valid."""
    return Preset(f"RTX 2080 SUPER, driver {driver}", driver, "11.3",
                  [_rtx_2080_super(driver)])


PRESETS = {"h100x8": h100_sxm, "h100-mig": h100_mig, "rtx2080s": rtx_2080_super,
           "old-driver": old_driver}
"""By name, for the demo and for tests that just want 'a box of that kind'."""
