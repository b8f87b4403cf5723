"""The StableTrainingJob API: pydantic models of spec and status, the single source of the
CRD schema (crdgen), the reference documentation (docs) and the operator's validation."""
