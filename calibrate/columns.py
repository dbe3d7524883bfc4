"""The columns of a configurations CSV (`finetwin predict`), apart from the loader so that the CLI's help
can name them without importing pandas."""

from __future__ import annotations

# What `finetwin predict` needs: the ten columns that say what the run is. The benchmark's protocol columns
# (CONFIG_COLUMNS minus these) are optional there, with these defaults: no identifier, no protocol (so no
# time limit), no fms-hf-tuning version, bfloat16 weights.
PREDICT_REQUIRED_COLUMNS: tuple[str, ...] = (
    "method", "model_name", "number_nodes", "gpu_model", "number_gpus", "tokens_per_sample", "batch_size",
    "enable_roce", "fast_moe", "fast_kernels",
)  # fmt: skip
PROTOCOL_DEFAULTS: dict[str, str] = {
    "identifier": "",
    "experiment_id": "",
    "fms_hf_tuning_version": "",
    "torch_dtype": "bfloat16",
}
