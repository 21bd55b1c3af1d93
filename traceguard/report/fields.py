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

#: Step fields of the link counters (docs/links.md; metrics.link_counters.LINK_STEP_FIELDS): the
#: step's PCIe and NVLink load from nsys GPU metrics (the busier direction, % of the link's peak),
#: over its GPU span and over its NCCL kernels. The store's ``steps`` columns are these too.
LINK_STEP_FIELDS = (
    "pcie_avg_pct",
    "pcie_peak_pct",
    "nvlink_avg_pct",
    "nvlink_peak_pct",
    "nccl_pcie_avg_pct",
    "nccl_nvlink_avg_pct",
)

#: Rank metrics of the link counters during the rank's NCCL kernels (metrics.link_counters.
#: LINK_RANK_METRICS without the window's sample count): the samples, PCIe and NVLink load (fractions
#: of the link's peak) and where NCCL's bytes went (shares of the samples). The store's
#: ``rank_results`` columns are these, with :data:`LINK_SPLIT_COLUMNS`.
LINK_RANK_FIELDS = (
    "link_nccl_samples",
    "pcie_nccl_avg",
    "pcie_nccl_p95",
    "pcie_nccl_peak",
    "nvlink_nccl_avg",
    "nvlink_nccl_p95",
    "nvlink_nccl_peak",
    "nccl_nvlink_share",
    "nccl_pcie_share",
    "nccl_link_idle_share",
)
#: Store column → key of the report's ``ranks[].links``: the GPU sampled and the NCCL kernels' time
#: split by where their bytes went (``nccl_split``: its ``nccl_ns`` and the ``*_ns`` of each part).
LINK_SPLIT_COLUMNS = {
    "link_device": ("device",),
    "link_nccl_ns": ("nccl_split", "nccl_ns"),
    "nccl_nvlink_ns": ("nccl_split", "nvlink_ns"),
    "nccl_pcie_ns": ("nccl_split", "pcie_ns"),
    "nccl_link_idle_ns": ("nccl_split", "idle_ns"),
}
