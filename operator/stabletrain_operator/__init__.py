"""The stabletrain operator: runs StableTrainingJobs and rolls them back when they go unstable."""
