"""Names of every activity the worker registers (and checks it registers). Some are steps the
current workflows reach through a composite activity (`unbind_agent`, `release_agent`); they stay
registered for workflows started by an earlier version, whose histories still schedule them."""

from __future__ import annotations

from enum import StrEnum


class BmaasActivity(StrEnum):
    """Run on the BMaaS task queue, whose activity rate is limited."""

    RESOLVE_BOOT_IMAGE = "resolve_boot_image"
    CREATE_WORKER_INSTANCE = "create_worker_instance"
    WAIT_INSTANCE_RUNNING = "wait_instance_running"
    DELETE_INSTANCE = "delete_instance"
    WAIT_INSTANCE_GONE = "wait_instance_gone"
    LIST_ORDER_INSTANCES = "list_order_instances"
    FIND_INSTANCES_WITH_MACS = "find_instances_with_macs"
    FIND_LOST_INSTANCES = "find_lost_instances"
    APPLY_SECURITY_GROUPS = "apply_security_groups"


class HubActivity(StrEnum):
    """Assisted Installer and hub activities, on the workflow task queue, and the one that asks
    Temporal about the worker workflows (`find_stopped_workers`)."""

    READ_ORDER = "read_order"
    WAIT_CLUSTER_REFERENCE = "wait_cluster_reference"
    READ_CLUSTER_RELEASE = "read_cluster_release"
    LIST_NODEPOOLS = "list_nodepools"
    ENSURE_INFRAENV = "ensure_infraenv"
    WAIT_INFRAENV_READY = "wait_infraenv_ready"
    DELETE_INFRAENV = "delete_infraenv"
    WATCH_AGENT_FOR_MACS = "watch_agent_for_macs"
    WAIT_AGENT_FOR_MACS = "wait_agent_for_macs"
    HAND_AGENT_TO_NODEPOOL = "hand_agent_to_nodepool"
    WAIT_AGENT_AND_HAND = "wait_agent_and_hand"
    WAIT_AGENT_INSTALLED = "wait_agent_installed"
    MARK_AGENT_REMOVING = "mark_agent_removing"
    WAIT_AGENT_UNBOUND = "wait_agent_unbound"
    UNBIND_AGENT = "unbind_agent"
    RELEASE_AGENT = "release_agent"
    DELETE_AGENT = "delete_agent"
    RELEASE_STALE_AGENTS = "release_stale_agents"
    RELEASE_WIPED_HOST_AGENTS = "release_wiped_host_agents"
    SYNC_NODEPOOL_REPLICAS = "sync_nodepool_replicas"
    ANNOTATE_MACHINE_FOR_DELETION = "annotate_machine_for_deletion"
    PUBLISH_ORDER_STATUS = "publish_order_status"
    FIND_STOPPED_WORKERS = "find_stopped_workers"
