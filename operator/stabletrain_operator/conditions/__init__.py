"""The job's status conditions: `entries` keeps the metav1.Condition list (one per type,
transition times that move only on a flip), `job` says what each of the job's conditions
reads in each phase, `preflight_condition` builds the Preflight condition from the pods' facts.
"""
