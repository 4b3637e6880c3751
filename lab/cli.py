"""`osac-workers lab ...`: run the local twins."""

from __future__ import annotations

from pathlib import Path

import typer

from lab.fulfillment.timings import TimingProfile

lab_app = typer.Typer(help="The lab twins of the fulfillment-service and the hub.", no_args_is_help=True)


@lab_app.command()
def serve(
    state_dir: Path = typer.Option(
        ..., "--state-dir", help="Where endpoints.json, the token files and the kubeconfig go."
    ),
    fulfillment_port: int = typer.Option(8100, "--fulfillment-port", help="0 picks a free port."),
    hub_port: int = typer.Option(
        8101, "--hub-port", min=0, max=65535, help="Hub twin port; 0 picks a free port."
    ),
    hub: bool = typer.Option(True, "--hub/--no-hub", help="Also run the hub twin (hosts boot into it)."),
    hub_tls: bool = typer.Option(
        True,
        "--hub-tls/--hub-plain-http",
        help="Serve the hub over https (kubectl sends tokens only over TLS).",
    ),
    crd_dirs: list[Path] = typer.Option(
        [], "--crd-dir", help="Extra CRD file or directory the hub serves and enforces (repeatable)."
    ),
    hosts: int = typer.Option(8, "--hosts", min=0, help="Seeded hosts; N // 4 of them are GPU hosts."),
    gpu_hosts: int | None = typer.Option(
        None, "--gpu-hosts", min=0, help="Override how many hosts are GPU hosts."
    ),
    timing: TimingProfile = typer.Option(
        TimingProfile.DEMO, "--timing", help="Step durations profile (both twins: BMaaS and the agents)."
    ),
    allocation_seconds: float | None = typer.Option(
        None, "--allocation-seconds", min=0, help="Seconds: create until a host is picked."
    ),
    image_write_seconds: float | None = typer.Option(
        None, "--image-write-seconds", min=0, help="Seconds: writing image and user data."
    ),
    boot_seconds: float | None = typer.Option(
        None, "--boot-seconds", min=0, help="Seconds: power-on until the host boots."
    ),
    wipe_seconds: float | None = typer.Option(
        None, "--wipe-seconds", min=0, help="Seconds: disk wipe of a released host."
    ),
    deprovision_seconds: float | None = typer.Option(
        None, "--deprovision-seconds", min=0, help="Seconds: removing a BMI that never got a host."
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds the fault RNG."),
    tenant: str = typer.Option("tenant-a", "--tenant", help="Tenant of the token written to tenant-token."),
) -> None:
    """Serve the fulfillment twin and the hub twin on 127.0.0.1 until SIGINT/SIGTERM."""
    # Imported here so `osac-workers --help` stays fast.
    from lab.serve import LabOptions, run_lab

    overrides = {
        "allocation_s": allocation_seconds,
        "image_write_s": image_write_seconds,
        "boot_s": boot_seconds,
        "wipe_s": wipe_seconds,
        "deprovision_s": deprovision_seconds,
    }
    options = LabOptions(
        state_dir=state_dir,
        fulfillment_port=fulfillment_port,
        hosts=hosts,
        gpu_hosts=gpu_hosts,
        timing=timing,
        timing_overrides={k: v for k, v in overrides.items() if v is not None},
        seed=seed,
        tenant=tenant,
        hub=hub,
        hub_port=hub_port,
        hub_tls=hub_tls,
        crd_dirs=crd_dirs,
    )
    try:
        run_lab(options, announce=typer.echo)
    except (RuntimeError, OSError) as exc:  # e.g. the port is taken: uvicorn has already said why
        typer.echo(f"lab serve: {exc}", err=True)
        raise typer.Exit(1) from None
