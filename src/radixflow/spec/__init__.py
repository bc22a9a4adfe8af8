"""Model specs: layer layout and the sizes the scheduler and cost model need (SPEC §2)."""

from radixflow.spec.model_spec import PRESETS, ModelSpec, get_spec, spec_from_hf_config

__all__ = ["PRESETS", "ModelSpec", "get_spec", "spec_from_hf_config"]
