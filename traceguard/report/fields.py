"""Names of the report's fields that several stages read (the store's columns, the CLI's), in a
module without imports: the service and the CLI load it without loading the analysis."""

#: Step fields of who waited for whom (docs/collectives.md): the NCCL kernel-time split (wait /
#: transfer), the GPU time broken down over the step's period (metrics.breakdown) with its
#: exposed-communication split, and the rank's lateness. The store's ``steps`` columns are these.
WAIT_STEP_FIELDS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "period_ns",
    "compute_ns",
    "comm_ns",
    "comm_wait_ns",
    "comm_transfer_ns",
    "copy_ns",
    "idle_host_ns",
    "idle_other_ns",
    "lateness_ns",
)
