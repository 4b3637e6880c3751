"""The fulfillment twin: OSAC's BMaaS fulfillment-service REST API (osac-reference.md §2), in-process.

Modules, one job each:
    models      resource shapes and enums, exactly as the gateway writes them
    objects     what every kind shares: metadata, PATCH merge, lock, List answers, caller scoping
    catalog     BareMetalInstanceTypes, DiskImages, ClusterVersions, BMI catalog items (CRUD)
    instances   BareMetalInstance CRUD and validation
    records     the BMI table (the single place BMI state lives) and its rendering
    lifecycle   the BMI state machine: allocate, boot, wipe, release, quarantine
    inventory   hosts, NICs, who holds which host
    faults      fault knobs with a seeded RNG
    audit       audit log, invariant check, request counters
    events      fan-out to `events/watch` streams; celfilter: CEL filters
    timings     step durations (demo / realistic / zero profiles)
    seed        what a fresh twin holds
    lab         FulfillmentConfig + FulfillmentLab (config and state)
    deps, routes_api, routes_lab, app    the HTTP side; `create_fulfillment_app(lab)`
    testing     `fulfillment_twin()`: a seeded twin on a free port for tests

Routes: `/api/private/v1/{baremetal_instances, bare_metal_instance_types, disk_images,
cluster_versions, baremetal_instance_catalog_items, events/watch}` (admin token),
`/api/fulfillment/v1/{baremetal_instances, bare_metal_instance_types}` (tenant tokens),
`/lab/v1/{hosts, faults, audit, stats, timings}` (admin token). `lab/serve.py` shows a whole BMI life
driven with curl.
"""

from lab.fulfillment.app import create_fulfillment_app
from lab.fulfillment.lab import FulfillmentConfig, FulfillmentLab
from lab.fulfillment.timings import TimingProfile, Timings

__all__ = ["FulfillmentConfig", "FulfillmentLab", "TimingProfile", "Timings", "create_fulfillment_app"]
