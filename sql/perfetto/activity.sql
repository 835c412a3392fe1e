-- traceq_activity: one row per device interval the interval metrics count (class comm | compute |
-- memcpy | memset; sync is a stream waiting, not work), shaped for Perfetto's interval macros: id
-- (slice id), ts, dur (ns), rank, device (-1 when unknown), class. The twin of sql/device_activity.sql.
include perfetto module traceq.device_events;

create perfetto table traceq_activity as
select id, start_ns as ts, dur_ns as dur, rank, coalesce(device, -1) as device, class
from traceq_device_events
where class <> 'sync'
