"""Collectors: what goes into the training job to record traces, power and run metadata.

    from traceq.collectors import TraceCollector
    with TraceCollector(out_dir="runs", run="llama7b-32n-tp2", tokens_per_step=4_194_304, tp=2) as tc:
        for batch in loader:
            train_step(batch)
            tc.step()

Depends on the standard library, torch (imported when a collector is created, not here) and,
optionally, nvidia-ml-py (imported when the power sampler starts). Nothing else from traceq.

Files per rank, in `<out_dir>/<run>/`: `rank<r>.trace.json.gz` (Kineto), `rank<r>.run.json`
(`traceq.collectors.metadata`), `rank<r>.power.jsonl` (`traceq.collectors.power`). The mapping from
trace time to wall-clock time is in `traceq.collectors.collector`.
"""

from __future__ import annotations

from traceq.collectors.collector import TraceCollector, import_torch
from traceq.collectors.config import CollectorConfig
from traceq.collectors.errors import CollectorConfigError, CollectorError
from traceq.collectors.files import POWER_FILE, RUN_FILE, TRACE_CYCLE_FILE, TRACE_FILE
from traceq.collectors.metadata import CLOCK_RULE
from traceq.collectors.model import count_non_embedding_params
from traceq.collectors.power import PowerSampler

__all__ = [
    "CLOCK_RULE",
    "POWER_FILE",
    "RUN_FILE",
    "TRACE_CYCLE_FILE",
    "TRACE_FILE",
    "CollectorConfig",
    "CollectorConfigError",
    "CollectorError",
    "PowerSampler",
    "TraceCollector",
    "count_non_embedding_params",
    "import_torch",
]
