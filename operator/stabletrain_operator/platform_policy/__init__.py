"""Platform policies: StableTrainingPolicy defaults and limits applied to a job's spec."""
