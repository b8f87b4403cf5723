"""`stabletrain` (also the kubectl plugin `kubectl stabletrain`): look at jobs, act on them by
hand, and replay a recorded run through the policy before trusting it live."""
