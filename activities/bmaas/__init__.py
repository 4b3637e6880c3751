"""BMaaS (fulfillment-service private API): client, shared BMI watcher and activities.

Wiring at worker start (one of each per process):

    client = BmaasClient(base_url, token_file, ca_bundle=...)
    watcher = BmiWatcher(client)
    bmaas = BmaasActivities(client, watcher, ignition_source)
    Worker(..., activities=bmaas.all())
"""

from activities.bmaas.activities import BmaasActivities, IgnitionSource
from activities.bmaas.client import BmaasClient, TokenFile
from activities.bmaas.errors import BmaasApiError
from activities.bmaas.snapshot import BmiSnapshot
from activities.bmaas.watcher import GONE, BmiWatcher

__all__ = [
    "GONE",
    "BmaasActivities",
    "BmaasApiError",
    "BmaasClient",
    "BmiSnapshot",
    "BmiWatcher",
    "IgnitionSource",
    "TokenFile",
]
