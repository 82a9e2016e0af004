"""GPU utilisation and memory through NVML, when a GPU and nvidia-ml-py are present.

Read at scrape time, so the numbers are current and no worker needs a polling thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("rlserve.gpu")


class NvmlCollector(Collector):
    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def utilization(self) -> float:
        """The busy fraction of this machine's GPUs, averaged."""
        nvml = self._nvml
        count = nvml.nvmlDeviceGetCount()
        busy = [
            nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(i)).gpu / 100.0
            for i in range(count)
        ]
        return sum(busy) / len(busy)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self._nvml
        util = GaugeMetricFamily(
            "rlserve_gpu_utilization_ratio", "GPU busy fraction (NVML)", labels=["gpu"]
        )
        used = GaugeMetricFamily(
            "rlserve_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "rlserve_gpu_memory_total_bytes", "GPU memory size (NVML)", labels=["gpu"]
        )
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            util.add_metric([str(index)], rates.gpu / 100.0)
            used.add_metric([str(index)], float(memory.used))
            total.add_metric([str(index)], float(memory.total))
        yield from (util, used, total)


@functools.cache
def gpu_collector() -> NvmlCollector | None:
    """A collector when NVML answers (the ``gpu`` extra on a GPU machine), else None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
    except Exception:  # no library, no driver, no device: no GPU metrics
        return None
    log.info("NVML found: exporting GPU utilisation and memory metrics")
    return NvmlCollector(pynvml)


def gpu_utilization() -> float | None:
    """The GPUs' busy fraction now, or None without a GPU (or without NVML)."""
    collector = gpu_collector()
    if collector is None:
        return None
    try:
        return round(collector.utilization(), 3)
    except Exception:  # a driver that stopped answering: no figure rather than no health
        return None
