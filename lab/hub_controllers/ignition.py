"""The discovery ignition: rendered for an InfraEnv, and read back by a booting host.

The layout follows assisted-service's discovery template (Ignition spec 3.1.0): an `agent.service`
systemd unit whose `ExecStart` runs `/usr/local/bin/agent --url <service> --infra-env-id <id>` and
whose `Environment=PULL_SECRET_TOKEN=<token>` carries the agent's credential, the pull secret at
`/root/.docker/config.json`, the SSH key of user `core`, and the helper files and units the real
image carries (data: URLs, percent-encoded or base64). With a typical pull secret it is ~15 KB.

A host "runs" the ignition by extracting that agent configuration: registration goes to
`<url>/api/assisted-install/v2/infra-envs/<infra-env-id>/hosts` with the token as `X-Secret-Key`.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from lab.hub_controllers.constants import ASSISTED_API_PREFIX

IGNITION_VERSION = "3.1.0"
AGENT_IMAGE = (
    "registry.redhat.io/multicluster-engine/assisted-installer-agent-rhel9"
    "@sha256:4f6b8f5c0a43f3c8d7b4ab3de1c2f39a7d1f0c6e2e5b9a8d7c6b5a4f3e2d1c0b"
)
AGENT_UNIT = "agent.service"


@dataclass(frozen=True)
class DiscoveryAgentConfig:
    """What the discovery agent needs to register: where, into which InfraEnv, with what token."""

    service_url: str
    infra_env_id: str
    agent_token: str = field(repr=False)  # a secret: never in a repr, a log or a test's output
    insecure: bool = False  # `--insecure=true`: the agent does not verify the service's certificate

    @property
    def registration_url(self) -> str:
        return f"{self.service_url.rstrip('/')}{ASSISTED_API_PREFIX}/infra-envs/{self.infra_env_id}/hosts"


# -- rendering ------------------------------------------------------------------------------------


def _data_url(text: str) -> str:
    return "data:," + quote(text, safe="")


def _data_url_b64(text: str) -> str:
    return "data:text/plain;charset=utf-8;base64," + base64.b64encode(text.encode()).decode()


def _file(path: str, source: str, mode: int = 0o644) -> dict[str, Any]:
    return {
        "overwrite": True,
        "path": path,
        "mode": mode,
        "user": {"name": "root"},
        "contents": {"source": source},
    }


def _agent_unit(service_url: str, infra_env_id: str, agent_token: str) -> str:
    return "\n".join(
        [
            "[Service]",
            "Type=simple",
            "Restart=always",
            "RestartSec=3",
            "StartLimitInterval=0",
            "Environment=HTTP_PROXY=",
            "Environment=http_proxy=",
            "Environment=HTTPS_PROXY=",
            "Environment=https_proxy=",
            "Environment=NO_PROXY=",
            "Environment=no_proxy=",
            f"Environment=PULL_SECRET_TOKEN={agent_token}",
            "TimeoutStartSec=180",
            f"ExecStartPre=/usr/local/bin/agent-fix-bz1964591 {AGENT_IMAGE}",
            f"ExecStartPre=/usr/local/bin/agent-pull-image {AGENT_IMAGE}",
            "ExecStartPre=podman run --pull=never --privileged --rm -v /usr/local/bin:/hostbin "
            f"{AGENT_IMAGE} cp /usr/bin/agent /hostbin",
            f"ExecStart=/usr/local/bin/agent --url {service_url} --infra-env-id {infra_env_id} "
            f"--agent-version {AGENT_IMAGE} --insecure=true",
            "",
            "[Unit]",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


_SELINUX_UNIT = """[Unit]
Description=Load the assisted-installer SELinux policy module
Before=agent.service
ConditionPathExists=/root/assisted.te
ConditionPathExists=!/var/lib/assisted/selinux-loaded

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStartPre=/usr/bin/checkmodule -M -m -o /root/assisted.mod /root/assisted.te
ExecStartPre=/usr/bin/semodule_package -o /root/assisted.pp -m /root/assisted.mod
ExecStart=/usr/sbin/semodule -i /root/assisted.pp
ExecStartPost=/usr/bin/mkdir -p /var/lib/assisted
ExecStartPost=/usr/bin/touch /var/lib/assisted/selinux-loaded

[Install]
WantedBy=multi-user.target
"""

_ISCSISTART_UNIT = """[Unit]
Description=Bring up iSCSI boot targets described by the firmware (iBFT)
DefaultDependencies=no
ConditionKernelCommandLine=rd.iscsi.firmware=1
Before=network-online.target agent.service
After=network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/iscsistart -b
SuccessExitStatus=21

[Install]
WantedBy=multi-user.target
"""

_FIX_SCRIPT = """#!/usr/bin/env bash
# After an unclean power-off podman's image store can hold a half-written layer of the agent
# image (rhbz#1964591). Starting the agent from it fails forever, so verify the image and drop it
# when it is unusable; agent-pull-image then fetches a clean copy.
set -u
image="${1:?usage: agent-fix-bz1964591 <image>}"

if ! podman image exists "${image}"; then
    exit 0
fi
if podman run --rm --pull=never --entrypoint /bin/true "${image}" >/dev/null 2>&1; then
    exit 0
fi
echo "agent image ${image} is damaged; removing it so that it is pulled again" >&2
podman rmi --force "${image}" >/dev/null 2>&1 || true
podman system reset --force >/dev/null 2>&1 || true
exit 0
"""

_PULL_SCRIPT = """#!/usr/bin/env bash
# Pull the discovery agent image with the cluster pull secret, retrying with a growing pause so
# that a host whose network comes up late (DHCP, LACP negotiation, slow switch ports) still
# registers on its own.
set -u
image="${1:?usage: agent-pull-image <image>}"
authfile=/root/.docker/config.json
delay=2

until podman image exists "${image}"; do
    if podman pull --authfile "${authfile}" "${image}"; then
        break
    fi
    echo "pulling ${image} failed; retrying in ${delay}s" >&2
    sleep "${delay}"
    if [ "${delay}" -lt 60 ]; then
        delay=$((delay * 2))
    fi
done

# Record what we run for the support bundle.
podman image inspect --format '{{.Id}} {{.Digest}}' "${image}" > /var/log/agent-image.txt 2>/dev/null || true
"""

_MOTD = """
** This host is running the discovery image of the Assisted Installer. **
** It reports its hardware inventory to the installation service and waits to be **
** bound to a cluster. Do not change this host manually: the installation service **
** will write the operating system to disk and reboot it when a cluster claims it. **

Useful commands:
  sudo journalctl -u agent.service -f       follow the discovery agent
  sudo podman ps                            containers started by the agent
  sudo cat /var/log/agent.log               agent log

"""

_IPV6_CONF = """[connection]
ipv6.dhcp-iaid=mac
ipv6.dhcp-duid=ll
"""

_MULTIPATH_CONF = """# Discovery image multipath defaults: only claim devices that really have more than one
# path, so that single-path disks keep their plain names in the inventory the agent reports.
defaults {
    user_friendly_names yes
    find_multipaths yes
    enable_foreign "^$"
}

blacklist_exceptions {
    property "(SCSI_IDENT_|ID_WWN)"
}

blacklist {
    devnode "^(ram|raw|loop|fd|md|dm-|sr|scd|st|nbd)[0-9]*"
    devnode "^hd[a-z]"
    devnode "^cciss!c[0-9]d[0-9]*"
}
"""

_SELINUX_POLICY = """module assisted 1.0;

require {
    type chronyd_t;
    type container_file_t;
    type container_t;
    type spc_t;
    type init_t;
    type unconfined_service_t;
    type var_run_t;
    type var_log_t;
    type sysfs_t;
    type proc_t;
    type device_t;
    type fixed_disk_device_t;
    type removable_device_t;
    type iscsid_t;
    type kernel_t;
    class dir { add_name create read remove_name search write getattr open };
    class file { create getattr open read write unlink append lock ioctl setattr };
    class sock_file { create write unlink getattr };
    class unix_stream_socket connectto;
    class blk_file { getattr ioctl open read };
    class chr_file { getattr ioctl open read write };
    class lnk_file read;
}

#============= chronyd_t ==============
# chronyc probes from the agent container talk to chronyd over its control socket.
allow chronyd_t container_file_t:dir { add_name remove_name search write };
allow chronyd_t container_file_t:sock_file { create unlink write getattr };
allow chronyd_t container_t:unix_stream_socket connectto;

#============= container_t ==============
# The inventory step reads disks, SMART data and firmware tables from the host.
allow container_t fixed_disk_device_t:blk_file { getattr ioctl open read };
allow container_t removable_device_t:blk_file { getattr ioctl open read };
allow container_t device_t:chr_file { getattr ioctl open read write };
allow container_t sysfs_t:file { getattr open read };
allow container_t proc_t:file { getattr open read };
allow container_t var_log_t:dir { add_name create search write getattr open };
allow container_t var_log_t:file { create getattr open read write append lock ioctl setattr };
allow container_t var_run_t:dir { read search getattr open };
allow container_t var_run_t:sock_file { write getattr };

#============= spc_t ==============
allow spc_t iscsid_t:unix_stream_socket connectto;
allow spc_t kernel_t:unix_stream_socket connectto;
allow spc_t init_t:unix_stream_socket connectto;
allow spc_t unconfined_service_t:unix_stream_socket connectto;
"""

_CHRONY_SCRIPT = """#!/usr/bin/env bash
# Seed chrony with the NTP servers handed out by DHCP before the agent measures clock skew; the
# installation refuses hosts whose clock is far from the service's.
set -u
conf=/etc/chrony.conf
for lease in /var/lib/NetworkManager/*.lease; do
    [ -e "${lease}" ] || continue
    for server in $(awk -F= '/^NTP_SERVERS=/{print $2}' "${lease}"); do
        grep -q "^server ${server} " "${conf}" || echo "server ${server} iburst" >> "${conf}"
    done
done
systemctl try-restart chronyd.service || true
"""

_CHRONY_UNIT = """[Unit]
Description=Add DHCP-provided NTP sources to chrony before discovery
After=network-online.target
Before=agent.service
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/add-ntp-sources.sh

[Install]
WantedBy=multi-user.target
"""


def render_discovery_ignition(
    *,
    service_url: str,
    infra_env_id: str,
    agent_token: str,
    pull_secret: str,
    ssh_authorized_key: str | None = None,
) -> str:
    """The discovery ignition document (compact JSON text) for one InfraEnv."""
    core: dict[str, Any] = {"name": "core", "passwordHash": "!", "groups": ["sudo"]}
    if ssh_authorized_key:
        core["sshAuthorizedKeys"] = [ssh_authorized_key.strip()]
    document: dict[str, Any] = {
        "ignition": {"version": IGNITION_VERSION},
        "passwd": {"users": [core]},
        "systemd": {
            "units": [
                {
                    "name": AGENT_UNIT,
                    "enabled": True,
                    "contents": _agent_unit(service_url, infra_env_id, agent_token),
                },
                {"name": "selinux.service", "enabled": True, "contents": _SELINUX_UNIT},
                {"name": "multipathd.service", "enabled": True},
                {"name": "iscsistart.service", "enabled": True, "contents": _ISCSISTART_UNIT},
                {"name": "add-ntp-sources.service", "enabled": True, "contents": _CHRONY_UNIT},
            ]
        },
        "storage": {
            "files": [
                _file("/usr/local/bin/agent-fix-bz1964591", _data_url(_FIX_SCRIPT), 0o755),
                _file("/usr/local/bin/agent-pull-image", _data_url(_PULL_SCRIPT), 0o755),
                _file("/etc/motd", _data_url(_MOTD)),
                _file("/etc/multipath.conf", _data_url_b64(_MULTIPATH_CONF)),
                _file("/etc/NetworkManager/conf.d/01-ipv6.conf", _data_url(_IPV6_CONF)),
                _file("/root/.docker/config.json", _data_url(pull_secret)),
                _file(
                    "/root/assisted.te",
                    "data:text/plain;base64," + base64.b64encode(_SELINUX_POLICY.encode()).decode(),
                ),
                _file("/usr/local/bin/add-ntp-sources.sh", _data_url_b64(_CHRONY_SCRIPT), 0o755),
            ]
        },
    }
    return json.dumps(document, separators=(",", ":"))


# -- reading back (what a booting host does) ------------------------------------------------------

_EXEC_START = re.compile(r"^ExecStart=(\S*/agent)\s+(.*)$", re.MULTILINE)
_TOKEN = re.compile(r"^Environment=PULL_SECRET_TOKEN=(\S+)\s*$", re.MULTILINE)


def load_ignition(user_data: str) -> dict[str, Any] | None:
    """The parsed Ignition v3 document, or None when `user_data` is not one."""
    try:
        document = json.loads(user_data)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    version = (
        document.get("ignition", {}).get("version") if isinstance(document.get("ignition"), dict) else None
    )
    if not isinstance(version, str) or not version.startswith("3."):
        return None
    return document


def config_sources(document: dict[str, Any]) -> list[str]:
    """URLs of configs the document merges or replaces itself with (`ignition.config`)."""
    config = document.get("ignition", {}).get("config") or {}
    sources: list[str] = []
    replace = config.get("replace") or {}
    if isinstance(replace, dict) and isinstance(replace.get("source"), str):
        sources.append(replace["source"])
    for item in config.get("merge") or []:
        if isinstance(item, dict) and isinstance(item.get("source"), str):
            sources.append(item["source"])
    return sources


def decode_data_url(url: str) -> str | None:
    if not url.startswith("data:"):
        return None
    header, _, payload = url[5:].partition(",")
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload).decode()
        except ValueError:
            return None
    return unquote(payload)


def extract_agent_config(document: dict[str, Any]) -> DiscoveryAgentConfig | None:
    """The agent configuration of a discovery ignition, or None when it carries none."""
    units = document.get("systemd", {}).get("units") or []
    for unit in units:
        if not isinstance(unit, dict) or unit.get("name") != AGENT_UNIT or unit.get("enabled") is False:
            continue
        contents = unit.get("contents")
        if not isinstance(contents, str):
            continue
        exec_start, token = _EXEC_START.search(contents), _TOKEN.search(contents)
        if exec_start is None or token is None:
            continue
        args = _flags(shlex.split(exec_start.group(2)))
        url, infra_env_id = args.get("--url"), args.get("--infra-env-id")
        if url and infra_env_id:
            insecure = args.get("--insecure", "false").lower() == "true"
            return DiscoveryAgentConfig(url, infra_env_id, token.group(1), insecure)
    return None


def _flags(argv: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg.startswith("--") and "=" in arg:
            name, _, value = arg.partition("=")
            flags[name] = value
        elif arg.startswith("--") and index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            flags[arg] = argv[index + 1]
            index += 1
        index += 1
    return flags
